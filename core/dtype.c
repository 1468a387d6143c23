#include "core/internal.h"

static const size_t sizes[DG_NUM_DTYPES] = {4, 8, 2, 4, 8, 2};
static const char *const names[DG_NUM_DTYPES] = {"f32", "f64", "bf16", "i32", "i64", "f16"};

size_t dg_dtype_size(dg_dtype dt) { return dt < DG_NUM_DTYPES ? sizes[dt] : 0; }
const char *dg_dtype_name(dg_dtype dt) { return dt < DG_NUM_DTYPES ? names[dt] : "?"; }
bool dg_dtype_is_float(dg_dtype dt) { return dt == DG_F32 || dt == DG_F64 || dt == DG_BF16 || dt == DG_F16; }
const char *dg_device_name(dg_device d) { return d == DG_CUDA ? "cuda" : "cpu"; }

bool dg_cuda_available(void) {
#ifdef DG_HAVE_CUDA
    return dg_cuda_device_count() > 0;
#else
    return false;
#endif
}

double dg_cuda_free_bytes(void) {
#ifdef DG_HAVE_CUDA
    size_t free_bytes = 0, total = 0;
    if (dg_cuda_available() && dg_cuda_mem_info(&free_bytes, &total) == 0) return (double)free_bytes;
    dg_clear_error();
#endif
    return -1;
}
