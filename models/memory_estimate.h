/* How much memory a training run needs, estimated before anything is allocated, and how much the
 * machine can give, so that `train --batch 1000000000` is refused with a message instead of running
 * the machine out of memory. */
#ifndef DG_MODELS_MEMORY_ESTIMATE_H
#define DG_MODELS_MEMORY_ESTIMATE_H

#include "models/model_config.h"
#include "models/train_config.h"

/* Bytes a training run of mc and tc holds at its peak: the parameters with their gradients and
 * AdamW's two moments, the activations a step saves for its backward pass (per token and layer: the
 * projections, the MLP, the chunked delta rule's per-chunk states and chunk-local matrices), one
 * chunk of the head's logits (the loss never stores them whole), and the held-out set.  Computed in double, so absurd sizes do not overflow.
 * Fitted to dg_peak_bytes on the CPU: within 15% of it for the default model and for small GDN and
 * KDA models, chunked or recurrent (tests/test_model_memory.c checks it). */
double dg_train_memory_estimate(const dg_model_config *mc, const dg_train_config *tc);

/* Bytes of the training state alone: the parameters, their gradients and AdamW's two moments, all
 * f32 (16 bytes a parameter), and with mixed precision the parameters' bf16 copies (18).  A GPU
 * run whose state does not fit in the GPU's free memory is refused before the first step. */
double dg_train_state_bytes(const dg_model_config *mc, bool mixed);

/* Bytes of activations a step surely keeps for its backward pass: every layer's input, one value a
 * token and channel (2 bytes with mixed precision, else 4).  A lower bound, not an estimate (the
 * projections, the MLP and the delta rule's working sets come on top), so a GPU run refused for it
 * could never have fit; computed in double. */
double dg_train_activation_floor(const dg_model_config *mc, const dg_train_config *tc, bool mixed);

/* Bytes this process may still allocate: MemAvailable of /proc/meminfo, lowered to what the cgroup's
 * limit leaves (containers); -1 when unknown. */
double dg_memory_available(void);

/* "1.5 GB", "230 MB", "12.0 TB" */
char *dg_format_bytes(double bytes, char *buf, size_t n);

#endif
