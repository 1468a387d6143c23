/* Every op of deltagrad, once (X-macro; see ops/registry.c).  Order is the order of tables. */
/* elementwise (ops/elementwise.c) */
DG_OP(add) DG_OP(sub) DG_OP(mul) DG_OP(div) DG_OP(neg)
DG_OP(add_scalar) DG_OP(mul_scalar) DG_OP(pow_scalar)
DG_OP(exp) DG_OP(log) DG_OP(sqrt) DG_OP(rsqrt) DG_OP(sigmoid) DG_OP(logsigmoid) DG_OP(silu)
DG_OP(softplus) DG_OP(tanh)
/* reductions (ops/reduce.c), matmul (ops/matmul.c) */
DG_OP(sum) DG_OP(mean) DG_OP(matmul)
/* shape and views (ops/shape.c), copies (ops/copy.c) */
DG_OP(reshape) DG_OP(permute) DG_OP(slice) DG_OP(expand) DG_OP(cat) DG_OP(contiguous) DG_OP(to_dtype)
/* network pieces (ops/nn_*.c) */
DG_OP(linear) DG_OP(embedding) DG_OP(rms_norm) DG_OP(gated_rms_norm) DG_OP(l2norm) DG_OP(conv1d)
DG_OP(swiglu) DG_OP(cross_entropy)
/* the delta-rule family (ops/delta/) */
DG_OP(delta_rule) DG_OP(gated_delta_rule) DG_OP(kda) DG_OP(gdn_gate) DG_OP(kda_gate)
DG_OP(chunk_local_cumsum) DG_OP(chunk_scaled_dot_kkt) DG_OP(solve_tril)
