/* safetensors reader and writer (format and guarantees in safetensors.h). */
#include "models/safetensors.h"

#include "models/atomic_file.h"
#include "models/infra_common.h"
#include "models/json.h"
#include "models/open_regular.h"

#include <errno.h>
#include <pthread.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (the file format is little-endian)"
#endif

static const char *const st_names[DG_NUM_DTYPES] = {"F32", "F64", "BF16", "I32", "I64", "F16"};

const char *dg_st_dtype_name(dg_dtype dt) { return dt < DG_NUM_DTYPES ? st_names[dt] : "?"; }

static int st_dtype_from_name(const char *s, dg_dtype *dt) {
    for (int i = 0; i < DG_NUM_DTYPES; i++)
        if (!strcmp(s, st_names[i])) {
            *dt = (dg_dtype)i;
            return 0;
        }
    return -1;
}

/* ---- CRC-32 ---------------------------------------------------------------------------------- */

static uint32_t crc_table[256];
static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t dg_crc32(uint32_t crc, const void *data, size_t n) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc_init);
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

/* ---- writer ---------------------------------------------------------------------------------- */

/* Calls fn on each contiguous run of bytes of a host tensor, in row-major order. */
typedef int (*chunk_fn)(void *ctx, const void *p, size_t n);
static int for_each_chunk(const dg_tensor *t, chunk_fn fn, void *ctx) {
    size_t es = dg_dtype_size(t->dtype);
    int64_t numel = dg_numel(t);
    if (numel == 0) return 0;
    if (dg_is_contiguous(t)) return fn(ctx, dgm_data(t), (size_t)numel * es);
    /* strided: gather one innermost row at a time */
    int nd = t->ndim;
    int64_t inner = t->shape[nd - 1];
    char *row = malloc((size_t)inner * es);
    if (!row) return -1;
    int64_t idx[DG_MAX_DIMS] = {0};
    int rc = 0;
    for (;;) {
        const char *base = (const char *)t->storage->data;
        int64_t off = t->offset;
        for (int d = 0; d < nd - 1; d++) off += idx[d] * t->stride[d];
        for (int64_t i = 0; i < inner; i++)
            memcpy(row + (size_t)i * es, base + (size_t)(off + i * t->stride[nd - 1]) * es, es);
        if ((rc = fn(ctx, row, (size_t)inner * es))) break;
        int d = nd - 2;
        while (d >= 0 && ++idx[d] == t->shape[d]) idx[d--] = 0;
        if (d < 0) break;
    }
    free(row);
    return rc;
}

static int crc_chunk(void *ctx, const void *p, size_t n) {
    uint32_t *crc = ctx;
    *crc = dg_crc32(*crc, p, n);
    return 0;
}
static int write_chunk(void *ctx, const void *p, size_t n) { return fwrite(p, 1, n, (FILE *)ctx) == n ? 0 : -1; }

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Unique, non-empty, valid UTF-8, not "__metadata__"; what = "tensor name" or "metadata key". */
static int check_names(const char *path, int n, const char **names, const char *what) {
    if (n <= 0) return 0; /* n < 0 is rejected by the caller; the guard lets compilers see size > 0 */
    for (int i = 0; i < n; i++) {
        if (!names[i] || !names[i][0]) {
            dg_error("safetensors: writing '%s': %s %d is empty or NULL", path, what, i);
            return -1;
        }
        if (!dg_utf8_valid(names[i], strlen(names[i]))) {
            dg_error("safetensors: writing '%s': %s %d is not valid UTF-8", path, what, i);
            return -1;
        }
        if (!strcmp(names[i], "__metadata__") || !strcmp(names[i], DG_ST_CRC_KEY)) {
            dg_error("safetensors: writing '%s': %s \"%s\" is reserved", path, what, names[i]);
            return -1;
        }
    }
    const char **sorted = malloc((size_t)n * sizeof *sorted);
    if (!sorted) {
        dg_error("safetensors: out of memory");
        return -1;
    }
    memcpy(sorted, names, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_str);
    int rc = 0;
    for (int i = 1; i < n && !rc; i++)
        if (!strcmp(sorted[i - 1], sorted[i])) {
            dg_error("safetensors: writing '%s': %s \"%.200s\" appears twice", path, what, sorted[i]);
            rc = -1;
        }
    free(sorted);
    return rc;
}

int dg_st_write(const char *path, int n, const char *const *names_in, dg_tensor *const *tensors, int n_meta,
                const char *const *keys, const char *const *values) {
    if (!path || n < 0 || n_meta < 0 || (n > 0 && !tensors) || (n_meta > 0 && (!keys || !values))) {
        dg_error("safetensors: dg_st_write: bad arguments (path %s, n %d, n_meta %d)", path ? path : "NULL", n, n_meta);
        return -1;
    }
    int rc = -1;
    char *header = NULL;
    size_t header_len = 0;
    FILE *hf = NULL;
    dg_atomic_file af = {0};
    const char **names = malloc((size_t)(n ? n : 1) * sizeof *names);
    if (!names) {
        dg_error("safetensors: out of memory");
        return -1;
    }
    for (int i = 0; i < n; i++) names[i] = names_in ? names_in[i] : tensors[i] ? tensors[i]->name : NULL;
    if (check_names(path, n, names, "tensor name") || check_names(path, n_meta, (const char **)keys, "metadata key"))
        goto out;
    for (int i = 0; i < n_meta; i++)
        if (!values[i] || !dg_utf8_valid(values[i], strlen(values[i]))) {
            dg_error("safetensors: writing '%s': metadata value of \"%s\" is NULL or not UTF-8", path, keys[i]);
            goto out;
        }
    uint32_t crc = 0;
    for (int i = 0; i < n; i++) {
        const dg_tensor *t = tensors[i];
        if (!t) {
            dg_error("safetensors: writing '%s': tensor \"%s\" is NULL", path, names[i]);
            goto out;
        }
        if (t->device != DG_CPU) {
            dg_error("safetensors: writing '%s': tensor \"%s\" is on %s; copy it to the host first", path, names[i],
                     dg_device_name(t->device));
            goto out;
        }
        if (t->dtype >= DG_NUM_DTYPES) {
            dg_error("safetensors: writing '%s': tensor \"%s\" has an unknown dtype", path, names[i]);
            goto out;
        }
        if (for_each_chunk(t, crc_chunk, &crc)) {
            dg_error("safetensors: out of memory");
            goto out;
        }
    }

    /* the JSON header */
    hf = open_memstream(&header, &header_len);
    if (!hf) {
        dg_error("safetensors: out of memory");
        goto out;
    }
    fputs("{\"__metadata__\":{", hf);
    for (int i = 0; i < n_meta; i++) {
        dg_json_write_string(hf, keys[i]);
        fputc(':', hf);
        dg_json_write_string(hf, values[i]);
        fputc(',', hf);
    }
    fprintf(hf, "\"%s\":\"%08" PRIx32 "\"}", DG_ST_CRC_KEY, crc);
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        const dg_tensor *t = tensors[i];
        uint64_t nbytes = (uint64_t)dg_numel(t) * dg_dtype_size(t->dtype);
        fputc(',', hf);
        dg_json_write_string(hf, names[i]);
        fprintf(hf, ":{\"dtype\":\"%s\",\"shape\":[", st_names[t->dtype]);
        for (int d = 0; d < t->ndim; d++) fprintf(hf, d ? ",%" PRId64 : "%" PRId64, t->shape[d]);
        fprintf(hf, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", offset, offset + nbytes);
        offset += nbytes;
    }
    fputc('}', hf);
    while ((8 + ftell(hf)) % 8) fputc(' ', hf); /* data 8-byte aligned */
    if (fclose(hf) != 0) {
        hf = NULL;
        dg_error("safetensors: out of memory");
        goto out;
    }
    hf = NULL;

    if (dg_atomic_open(&af, path, "safetensors")) goto out;
    unsigned char len8[8];
    for (int b = 0; b < 8; b++) len8[b] = (unsigned char)((uint64_t)header_len >> (8 * b));
    int werr = fwrite(len8, 1, 8, af.f) != 8 || fwrite(header, 1, header_len, af.f) != header_len;
    for (int i = 0; i < n && !werr; i++) werr = for_each_chunk(tensors[i], write_chunk, af.f) != 0;
    if (werr) {
        dg_error("safetensors: writing '%s': %s", path, strerror(errno ? errno : EIO));
        dg_atomic_abort(&af);
        goto out;
    }
    rc = dg_atomic_commit(&af, "safetensors");
out:
    if (hf) fclose(hf);
    free(header);
    free(names);
    return rc;
}

/* ---- reader ---------------------------------------------------------------------------------- */

typedef struct entry {
    const char *name; /* points into the JSON tree */
    dg_dtype dtype;
    int ndim;
    int64_t shape[DG_MAX_DIMS];
    uint64_t begin, end;
} entry;

static int cmp_entry(const void *a, const void *b) {
    const entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static bool nonneg_int(const dg_json *j) { return j && j->type == DG_JSON_NUMBER && j->is_int && j->integer >= 0; }

/* Validates one tensor entry of the header into e. */
static int parse_entry(const char *path, const char *name, const dg_json *v, entry *e) {
    if (v->type != DG_JSON_OBJECT) {
        dg_error("safetensors: '%s': entry \"%.200s\" has JSON type %s, expected an object with dtype, shape, "
                 "data_offsets",
                 path, name, dg_json_type_name(v->type));
        return -1;
    }
    for (int i = 0; i < v->n; i++)
        if (strcmp(v->keys[i], "dtype") && strcmp(v->keys[i], "shape") && strcmp(v->keys[i], "data_offsets")) {
            dg_error("safetensors: '%s': tensor \"%.200s\" has an unknown field \"%.64s\"", path, name, v->keys[i]);
            return -1;
        }
    const dg_json *dt = dg_json_get(v, "dtype"), *sh = dg_json_get(v, "shape"), *off = dg_json_get(v, "data_offsets");
    if (!dt || !sh || !off) {
        dg_error("safetensors: '%s': tensor \"%.200s\" lacks \"%s\"", path, name,
                 !dt   ? "dtype"
                 : !sh ? "shape"
                       : "data_offsets");
        return -1;
    }
    e->name = name;
    if (dt->type != DG_JSON_STRING || st_dtype_from_name(dt->string, &e->dtype)) {
        dg_error("safetensors: '%s': tensor \"%.200s\" has dtype %s%.32s%s; supported: F32, F64, BF16, F16, I32, I64",
                 path, name, dt->type == DG_JSON_STRING ? "\"" : "",
                 dt->type == DG_JSON_STRING ? dt->string : "(not a string)", dt->type == DG_JSON_STRING ? "\"" : "");
        return -1;
    }
    if (sh->type != DG_JSON_ARRAY) {
        dg_error("safetensors: '%s': tensor \"%.200s\": shape is not an array", path, name);
        return -1;
    }
    if (sh->n > DG_MAX_DIMS) {
        dg_error("safetensors: '%s': tensor \"%.200s\" has %d dimensions; at most %d are supported", path, name, sh->n,
                 DG_MAX_DIMS);
        return -1;
    }
    e->ndim = sh->n;
    uint64_t nbytes = dg_dtype_size(e->dtype);
    bool overflow = false;
    for (int d = 0; d < sh->n; d++) {
        if (!nonneg_int(&sh->items[d])) {
            dg_error("safetensors: '%s': tensor \"%.200s\": shape[%d] is not a non-negative integer", path, name, d);
            return -1;
        }
        e->shape[d] = sh->items[d].integer;
        if (e->shape[d] && nbytes > (uint64_t)INT64_MAX / (uint64_t)e->shape[d]) overflow = true;
        else nbytes *= (uint64_t)e->shape[d];
    }
    if (off->type != DG_JSON_ARRAY || off->n != 2 || !nonneg_int(&off->items[0]) || !nonneg_int(&off->items[1])) {
        dg_error("safetensors: '%s': tensor \"%.200s\": data_offsets is not [BEGIN, END] of non-negative integers",
                 path, name);
        return -1;
    }
    e->begin = (uint64_t)off->items[0].integer;
    e->end = (uint64_t)off->items[1].integer;
    if (e->end < e->begin) {
        dg_error("safetensors: '%s': tensor \"%.200s\": data_offsets [%" PRIu64 ", %" PRIu64 "] end before they begin",
                 path, name, e->begin, e->end);
        return -1;
    }
    if (overflow) {
        dg_error("safetensors: '%s': tensor \"%.200s\" has shape %s, too large", path, name,
                 dg_shape_text(e->ndim, e->shape));
        return -1;
    }
    if (nbytes != e->end - e->begin) {
        dg_error("safetensors: '%s': tensor \"%.200s\" is %s %s = %" PRIu64 " bytes but its data_offsets [%" PRIu64
                 ", %" PRIu64 "] span %" PRIu64 " bytes",
                 path, name, st_names[e->dtype], dg_shape_text(e->ndim, e->shape), nbytes, e->begin, e->end,
                 e->end - e->begin);
        return -1;
    }
    return 0;
}

void dg_st_free(dg_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) {
        free(f->names[i]);
        dg_release(f->tensors[i]);
    }
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->names);
    free(f->tensors);
    free(f->meta_keys);
    free(f->meta_values);
    free(f->path);
    free(f);
}

dg_st_file *dg_st_read(const char *path) {
    if (!path) {
        dg_error("safetensors: NULL path");
        return NULL;
    }
    dg_st_file *res = NULL;
    dg_json *root = NULL;
    char *header = NULL;
    entry *ents = NULL;
    FILE *fp = dg_fopen_regular(path, "safetensors"); /* a FIFO or a device is refused, not waited on */
    if (!fp) return NULL;
    struct stat st;
    if (fstat(fileno(fp), &st) != 0) {
        dg_error("safetensors: cannot stat '%s': %s", path, strerror(errno));
        goto fail;
    }
    uint64_t fsize = (uint64_t)st.st_size;
    unsigned char len8[8];
    if (fsize < 8 || fread(len8, 1, 8, fp) != 8) {
        dg_error("safetensors: '%s': file is %" PRIu64 " bytes, too short for the 8-byte header length (truncated?)",
                 path, fsize);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int b = 7; b >= 0; b--) hlen = (hlen << 8) | len8[b];
    if (hlen == 0 || hlen > fsize - 8) {
        dg_error("safetensors: '%s': header length %" PRIu64 " does not fit in the %" PRIu64
                 " bytes after the length field (truncated or not a safetensors file?)",
                 path, hlen, fsize - 8);
        goto fail;
    }
    if (hlen > DG_ST_MAX_HEADER) {
        dg_error("safetensors: '%s': header length %" PRIu64 " exceeds the limit of %llu bytes", path, hlen,
                 DG_ST_MAX_HEADER);
        goto fail;
    }
    header = malloc(hlen);
    if (!header) {
        dg_error("safetensors: '%s': out of memory for a %" PRIu64 "-byte header", path, hlen);
        goto fail;
    }
    if (fread(header, 1, hlen, fp) != hlen) {
        dg_error("safetensors: '%s': could not read the %" PRIu64 "-byte header (file changed while reading?)", path,
                 hlen);
        goto fail;
    }
    if (header[0] != '{') {
        dg_error("safetensors: '%s': header does not start with '{' (not a safetensors file?)", path);
        goto fail;
    }
    char jerr[200];
    root = dg_json_parse(header, hlen, jerr, sizeof jerr);
    if (!root) {
        dg_error("safetensors: '%s': header is not valid JSON: %s", path, jerr);
        goto fail;
    }
    if (root->type != DG_JSON_OBJECT) {
        dg_error("safetensors: '%s': header has JSON type %s, expected an object", path, dg_json_type_name(root->type));
        goto fail;
    }

    res = calloc(1, sizeof *res);
    ents = calloc((size_t)root->n + 1, sizeof *ents);
    if (!res || !ents || !(res->path = strdup(path))) {
        dg_error("safetensors: out of memory");
        goto fail;
    }
    const dg_json *meta = NULL;
    int ne = 0;
    for (int i = 0; i < root->n; i++) {
        if (!strcmp(root->keys[i], "__metadata__")) {
            meta = &root->items[i];
            continue;
        }
        if (parse_entry(path, root->keys[i], &root->items[i], &ents[ne])) goto fail;
        ne++;
    }
    const char *crc_text = NULL;
    if (meta) {
        if (meta->type != DG_JSON_OBJECT) {
            dg_error("safetensors: '%s': __metadata__ has JSON type %s, expected an object of strings", path,
                     dg_json_type_name(meta->type));
            goto fail;
        }
        res->meta_keys = calloc((size_t)meta->n + 1, sizeof(char *));
        res->meta_values = calloc((size_t)meta->n + 1, sizeof(char *));
        if (!res->meta_keys || !res->meta_values) {
            dg_error("safetensors: out of memory");
            goto fail;
        }
        for (int i = 0; i < meta->n; i++) {
            if (meta->items[i].type != DG_JSON_STRING) {
                dg_error("safetensors: '%s': __metadata__ value of \"%.64s\" has JSON type %s, expected a string", path,
                         meta->keys[i], dg_json_type_name(meta->items[i].type));
                goto fail;
            }
            if (!strcmp(meta->keys[i], DG_ST_CRC_KEY)) {
                crc_text = meta->items[i].string;
                continue;
            }
            res->meta_keys[res->n_meta] = strdup(meta->keys[i]);
            res->meta_values[res->n_meta] = strdup(meta->items[i].string);
            res->n_meta++;
            if (!res->meta_keys[res->n_meta - 1] || !res->meta_values[res->n_meta - 1]) {
                dg_error("safetensors: out of memory");
                goto fail;
            }
        }
    }
    uint32_t crc_want = 0;
    if (crc_text) {
        char *end;
        unsigned long v = strtoul(crc_text, &end, 16);
        if (strlen(crc_text) != 8 || *end || v > 0xFFFFFFFFul) {
            dg_error("safetensors: '%s': %s is \"%.32s\", not 8 hex digits", path, DG_ST_CRC_KEY, crc_text);
            goto fail;
        }
        crc_want = (uint32_t)v;
    }

    /* the data section: tensors sorted by offset must tile [0, data_len) exactly */
    uint64_t data_len = fsize - 8 - hlen;
    qsort(ents, (size_t)ne, sizeof *ents, cmp_entry);
    uint64_t pos = 0;
    for (int i = 0; i < ne; i++) {
        if (ents[i].end > data_len) {
            dg_error("safetensors: '%s': tensor \"%.200s\" data_offsets [%" PRIu64 ", %" PRIu64
                     "] extend past the %" PRIu64 "-byte data section (truncated file?)",
                     path, ents[i].name, ents[i].begin, ents[i].end, data_len);
            goto fail;
        }
        if (ents[i].begin < pos) {
            dg_error("safetensors: '%s': tensors \"%.200s\" [%" PRIu64 ", %" PRIu64 ") and \"%.200s\" [%" PRIu64
                     ", %" PRIu64 ") overlap",
                     path, ents[i - 1].name, ents[i - 1].begin, ents[i - 1].end, ents[i].name, ents[i].begin,
                     ents[i].end);
            goto fail;
        }
        if (ents[i].begin > pos) {
            dg_error("safetensors: '%s': bytes [%" PRIu64 ", %" PRIu64 ") of the data section before tensor \"%.200s\""
                     " belong to no tensor",
                     path, pos, ents[i].begin, ents[i].name);
            goto fail;
        }
        pos = ents[i].end;
    }
    if (pos != data_len) {
        dg_error("safetensors: '%s': the data section is %" PRIu64 " bytes but the tensors cover %" PRIu64
                 " (trailing bytes)",
                 path, data_len, pos);
        goto fail;
    }

    res->names = calloc((size_t)ne + 1, sizeof *res->names);
    res->tensors = calloc((size_t)ne + 1, sizeof *res->tensors);
    if (!res->names || !res->tensors) {
        dg_error("safetensors: out of memory");
        goto fail;
    }
    uint32_t crc = 0;
    for (int i = 0; i < ne; i++) {
        dg_tensor *t = dgm_owned_zeros(ents[i].ndim, ents[i].shape, ents[i].dtype);
        res->names[i] = strdup(ents[i].name);
        if (!t || !res->names[i]) {
            dg_release(t);
            free(res->names[i]);
            res->names[i] = NULL;
            dg_error("safetensors: '%s': out of memory for tensor \"%.200s\" %s", path, ents[i].name,
                     dg_shape_text(ents[i].ndim, ents[i].shape));
            goto fail;
        }
        res->tensors[i] = t;
        res->n = i + 1;
        dg_set_name(t, ents[i].name);
        size_t nb = (size_t)(ents[i].end - ents[i].begin);
        if (nb && fread(dgm_data(t), 1, nb, fp) != nb) {
            dg_error("safetensors: '%s': short read in tensor \"%.200s\" (file changed while reading?)", path,
                     ents[i].name);
            goto fail;
        }
        crc = dg_crc32(crc, dgm_data(t), nb);
    }
    if (crc_text && crc != crc_want) {
        dg_error("safetensors: '%s': data checksum mismatch (%s %08" PRIx32 ", data %08" PRIx32
                 "): the file is corrupted",
                 path, DG_ST_CRC_KEY, crc_want, crc);
        goto fail;
    }
    res->crc_checked = crc_text != NULL;
    fclose(fp);
    dg_json_free(root);
    free(header);
    free(ents);
    return res;
fail:
    dg_st_free(res);
    dg_json_free(root);
    free(header);
    free(ents);
    fclose(fp);
    return NULL;
}

dg_tensor *dg_st_get(const dg_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) return f->tensors[i];
    return NULL;
}

const char *dg_st_meta(const dg_st_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta_keys[i], key)) return f->meta_values[i];
    return NULL;
}

int dg_st_copy_into(const dg_st_file *f, const char *name, dg_tensor *dst) {
    const char *path = f ? f->path : "?";
    dg_tensor *src = dg_st_get(f, name);
    if (!src) {
        dg_error("safetensors: '%s': no tensor named \"%.200s\"", path, name ? name : "(null)");
        return -1;
    }
    if (!dst || dst->device != DG_CPU || !dg_is_contiguous(dst)) {
        dg_error("safetensors: copy of \"%.200s\": the destination is not a contiguous host tensor", name);
        return -1;
    }
    if (src->dtype != dst->dtype || !dg_same_shape(src, dst)) {
        dg_error("safetensors: '%s': tensor \"%.200s\" is %s %s in the file but %s %s is expected", path, name,
                 st_names[src->dtype], dg_shp(src), dg_st_dtype_name(dst->dtype), dg_shp(dst));
        return -1;
    }
    memcpy(dgm_data(dst), dgm_data(src), (size_t)dg_numel(src) * dg_dtype_size(src->dtype));
    return 0;
}
