/* safetensors files (the format of Hugging Face's `safetensors`), read and written in C.
 *
 * Layout: 8 bytes, little-endian u64 N = header length; N bytes of JSON
 *   {"__metadata__": {"key": "value", ...},
 *    "NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]}, ...}
 * padded with spaces so that the data starts 8-byte aligned; then the data section: each tensor's
 * bytes, row-major, little-endian, at [BEGIN, END) relative to the start of the data section.
 * dtypes: F32, F64, BF16, I32, I64 (the runtime's; others are rejected with a clear message).
 *
 * Writing is atomic (models/atomic_file.h).  The writer adds the metadata entry
 * "deltagrad.data_crc32" (CRC-32 of the data section, 8 hex digits); the reader checks it when
 * present, so flipped bits in tensor data are caught, and hides it from the returned metadata.
 * Files from other writers (no such entry) are read without that check.
 *
 * Reading validates everything before trusting it and never crashes on a bad file: the header
 * length against the file size, the JSON (strict parser, models/json.h), every entry's fields
 * and types, dtype size x shape against its data_offsets, offsets inside the data section,
 * tensors contiguous and non-overlapping and covering the data section exactly.  Errors go to
 * dg_error as "safetensors: 'PATH': what is wrong". */
#ifndef DG_MODELS_SAFETENSORS_H
#define DG_MODELS_SAFETENSORS_H

#include "deltagrad.h"

#define DG_ST_MAX_HEADER 100000000ull /* as the reference implementation */
#define DG_ST_CRC_KEY "deltagrad.data_crc32"

typedef struct dg_st_file {
    char *path;
    int n; /* tensors, in data-offset order */
    char **names;
    dg_tensor **tensors; /* owned: host, contiguous, named (->name) */
    int n_meta;          /* "__metadata__" entries, in file order (the CRC entry left out) */
    char **meta_keys;
    char **meta_values;
    bool crc_checked; /* the file carried a data CRC and it matched */
} dg_st_file;

/* Writes n tensors (host; any strides; dtypes above) under names[i] (names NULL: each tensor's
 * ->name) and n_meta string pairs of metadata.  Names must be unique, non-empty UTF-8 and not
 * "__metadata__".  Returns 0, or -1 with dg_error set (the destination is then untouched). */
int dg_st_write(const char *path, int n, const char *const *names, dg_tensor *const *tensors, int n_meta,
                const char *const *keys, const char *const *values);

/* Reads and validates a whole file.  NULL with dg_error set on any problem.  The tensors are
 * owned by the returned struct whether or not a scope is open. */
dg_st_file *dg_st_read(const char *path);
void dg_st_free(dg_st_file *f);

/* Borrowed tensor named name, or NULL (no error set). */
dg_tensor *dg_st_get(const dg_st_file *f, const char *name);
/* Metadata value of key, or NULL. */
const char *dg_st_meta(const dg_st_file *f, const char *key);
/* Copies the tensor named name into dst (host, contiguous, same dtype and shape).  Returns 0, or
 * -1 with dg_error naming the tensor and both shapes (missing tensor, dtype or shape mismatch). */
int dg_st_copy_into(const dg_st_file *f, const char *name, dg_tensor *dst);

/* "F32", "F64", "BF16", "I32", "I64" */
const char *dg_st_dtype_name(dg_dtype dt);
/* CRC-32 (IEEE 802.3, as zlib's crc32) of n bytes, continuing from crc (start with 0). */
uint32_t dg_crc32(uint32_t crc, const void *data, size_t n);

#endif
