/* Collectives dispatched to NCCL when the build has it; see collective.h. */
#include "ops/collective.h"

#include <stdlib.h>

#ifdef DG_HAVE_NCCL
#include "kernels/cuda/nccl_comm.h"

_Static_assert(DG_COMM_ID_BYTES == DG_NCCL_ID_BYTES, "a communicator id is an ncclUniqueId");

/* the communicator is NCCL's: dg_comm is a name for dg_nccl */
struct dg_comm {
    dg_nccl *nccl;
};

bool dg_comm_available(void) { return true; }

int dg_comm_unique_id(unsigned char id[DG_COMM_ID_BYTES]) { return dg_nccl_unique_id(id); }

dg_comm *dg_comm_init(const unsigned char id[DG_COMM_ID_BYTES], int world, int rank, double timeout_s) {
    dg_comm *c = calloc(1, sizeof *c);
    if (!c) {
        dg_error("comm: out of host memory");
        return NULL;
    }
    if (!(c->nccl = dg_nccl_init(id, world, rank, timeout_s))) {
        free(c);
        return NULL;
    }
    return c;
}

/* x is an f32 or bf16 contiguous CUDA tensor (the collectives' operands); else dg_error naming who
 * and what. */
static int check_operand(const char *who, const char *what, const dg_tensor *x) {
    if (!x) return -1;
    if ((x->dtype != DG_F32 && x->dtype != DG_BF16) || x->device != DG_CUDA || !dg_is_contiguous(x)) {
        dg_error("%s: %s is %s %s on %s; an f32 or bf16 contiguous CUDA tensor is required", who, what,
                 dg_dtype_name(x->dtype), dg_shp(x), dg_device_name(x->device));
        return -1;
    }
    return 0;
}

int dg_comm_side_begin(dg_comm *c) { return dg_nccl_side_begin(c ? c->nccl : NULL); }

int dg_comm_side_copy_(dg_comm *c, dg_tensor *dst, int64_t dst_off, const dg_tensor *src, int64_t src_off, int64_t n) {
    if (check_operand("comm_side_copy", "dst", dst) || (src && check_operand("comm_side_copy", "src", src))) return -1;
    if (n < 0 || dst_off < 0 || src_off < 0 || dst_off + n > dg_numel(dst) || (src && src_off + n > dg_numel(src))) {
        dg_error("comm_side_copy: %lld elements from offset %lld of src %s to offset %lld of dst %s do not fit",
                 (long long)n, (long long)src_off, src ? dg_shp(src) : "(zeros)", (long long)dst_off, dg_shp(dst));
        return -1;
    }
    const size_t ds = dg_dtype_size(dst->dtype), ss = src ? dg_dtype_size(src->dtype) : 0;
    const char *s = src ? (const char *)dg_data_ptr(src) + (size_t)src_off * ss : NULL;
    return dg_nccl_side_copy(c ? c->nccl : NULL, (char *)dg_data_ptr(dst) + (size_t)dst_off * ds, dst->dtype == DG_BF16,
                             s, src && src->dtype == DG_BF16, n);
}

int dg_comm_side_mean_(dg_comm *c, dg_tensor *x) {
    if (check_operand("comm_side_mean", "x", x)) return -1;
    return dg_nccl_side_allreduce_mean(c ? c->nccl : NULL, dg_data_ptr(x), x->dtype == DG_BF16, dg_numel(x));
}

int dg_comm_side_join(dg_comm *c) { return dg_nccl_side_join(c ? c->nccl : NULL); }

int dg_comm_mark(dg_comm *c) { return dg_nccl_mark(c ? c->nccl : NULL); }

int dg_comm_wait(dg_comm *c) { return dg_nccl_wait(c ? c->nccl : NULL); }

void dg_comm_free(dg_comm *c) {
    if (!c) return;
    dg_nccl_destroy(c->nccl);
    free(c);
}

#else /* no NCCL in this build */

static int no_nccl(const char *who) {
#ifdef DG_HAVE_CUDA
    dg_error("%s: this build has no NCCL (nccl.h and libnccl were not found when it was configured: the CUDA "
             "toolkit's, or the Python wheel nvidia-nccl's); training on several GPUs needs it",
             who);
#else
    dg_error("%s: this build has no CUDA backend and so no NCCL; training on several GPUs needs a CUDA build with "
             "NCCL",
             who);
#endif
    return -1;
}

bool dg_comm_available(void) { return false; }

int dg_comm_unique_id(unsigned char id[DG_COMM_ID_BYTES]) {
    (void)id;
    return no_nccl("comm_unique_id");
}

dg_comm *dg_comm_init(const unsigned char id[DG_COMM_ID_BYTES], int world, int rank, double timeout_s) {
    (void)id, (void)world, (void)rank, (void)timeout_s;
    no_nccl("comm_init");
    return NULL;
}

int dg_comm_mark(dg_comm *c) {
    (void)c;
    return no_nccl("comm_mark");
}

int dg_comm_wait(dg_comm *c) {
    (void)c;
    return no_nccl("comm_wait");
}

int dg_comm_side_begin(dg_comm *c) {
    (void)c;
    return no_nccl("comm_side_begin");
}

int dg_comm_side_copy_(dg_comm *c, dg_tensor *dst, int64_t dst_off, const dg_tensor *src, int64_t src_off, int64_t n) {
    (void)c, (void)dst, (void)dst_off, (void)src, (void)src_off, (void)n;
    return no_nccl("comm_side_copy");
}

int dg_comm_side_mean_(dg_comm *c, dg_tensor *x) {
    (void)c, (void)x;
    return no_nccl("comm_side_mean");
}

int dg_comm_side_join(dg_comm *c) {
    (void)c;
    return no_nccl("comm_side_join");
}

void dg_comm_free(dg_comm *c) { (void)c; }

#endif
