/* Strict JSON parser (recursive descent over a byte buffer) and JSON string writer. */
#include "models/json.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

typedef struct parser {
    const unsigned char *s;
    size_t len, pos;
    char *err;
    size_t errlen;
    bool failed;
} parser;

static void fail(parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(parser *p, const char *fmt, ...) {
    if (p->failed) return;
    p->failed = true;
    int n = snprintf(p->err, p->errlen, "at byte %zu: ", p->pos);
    if (n < 0 || (size_t)n >= p->errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
    va_end(ap);
}

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

/* "found 'x'" or "found the end of the text" for messages */
static const char *found(parser *p) {
    static _Thread_local char buf[40];
    if (p->pos >= p->len) return "the end of the text";
    unsigned char c = p->s[p->pos];
    if (c >= 0x20 && c < 0x7f) snprintf(buf, sizeof buf, "'%c'", c);
    else snprintf(buf, sizeof buf, "byte 0x%02x", c);
    return buf;
}

/* ---- UTF-8 ---------------------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s[0..n), or 0 if invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07;
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
    if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
    return len;
}

bool dg_utf8_valid(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        size_t k = utf8_seq(u + i, len - i);
        if (!k) return false;
        i += k;
    }
    return true;
}

static size_t utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- values ---------------------------------------------------------------------------------- */

static void free_value(dg_json *j) {
    if (!j) return;
    free(j->string);
    for (int i = 0; i < j->n; i++) {
        if (j->keys) free(j->keys[i]);
        free_value(&j->items[i]);
    }
    free(j->keys);
    free(j->items);
    memset(j, 0, sizeof *j);
}

void dg_json_free(dg_json *j) {
    free_value(j);
    free(j);
}

static int parse_value(parser *p, dg_json *out, int depth);

static int hex4(parser *p, uint32_t *v) {
    if (p->len - p->pos < 4) {
        fail(p, "truncated \\u escape");
        return -1;
    }
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = p->s[p->pos + (size_t)i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) {
            p->pos += (size_t)i;
            fail(p, "bad hex digit in \\u escape");
            return -1;
        }
        x = x * 16 + (uint32_t)d;
    }
    p->pos += 4;
    *v = x;
    return 0;
}

/* A string starting at the opening quote; the decoded text is never longer than the source. */
static char *parse_string(parser *p) {
    size_t start = ++p->pos; /* past '"' */
    size_t end = start;
    while (end < p->len && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
    if (end >= p->len) {
        fail(p, "unterminated string");
        return NULL;
    }
    char *out = malloc(end - start + 1);
    if (!out) {
        fail(p, "out of memory");
        return NULL;
    }
    size_t o = 0;
    while (p->s[p->pos] != '"') {
        unsigned char c = p->s[p->pos];
        if (c < 0x20) {
            fail(p, "raw control character 0x%02x in a string (escape it)", c);
            goto bad;
        }
        if (c != '\\') {
            size_t k = utf8_seq(p->s + p->pos, p->len - p->pos);
            if (!k) {
                fail(p, "invalid UTF-8 in a string");
                goto bad;
            }
            memcpy(out + o, p->s + p->pos, k);
            o += k;
            p->pos += k;
            continue;
        }
        p->pos++;
        char e = (char)p->s[p->pos++];
        switch (e) {
        case '"': out[o++] = '"'; break;
        case '\\': out[o++] = '\\'; break;
        case '/': out[o++] = '/'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (hex4(p, &cp)) goto bad;
            if (cp >= 0xDC00 && cp <= 0xDFFF) {
                fail(p, "lone low surrogate in \\u escape");
                goto bad;
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
                    fail(p, "high surrogate not followed by a \\u low surrogate");
                    goto bad;
                }
                p->pos += 2;
                if (hex4(p, &lo)) goto bad;
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    fail(p, "high surrogate not followed by a low surrogate");
                    goto bad;
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (cp == 0) {
                fail(p, "\\u0000 in a string is not supported");
                goto bad;
            }
            o += utf8_encode(cp, out + o); /* <= the 6 or 12 source bytes */
            break;
        }
        default:
            p->pos--;
            fail(p, "bad escape '\\%c'", e >= 0x20 && e < 0x7f ? e : '?');
            goto bad;
        }
    }
    p->pos++; /* past '"' */
    out[o] = 0;
    return out;
bad:
    free(out);
    return NULL;
}

static int parse_number(parser *p, dg_json *out) {
    size_t start = p->pos;
    const unsigned char *s = p->s;
    size_t i = p->pos;
    bool integral = true;
    if (i < p->len && s[i] == '-') i++;
    if (i >= p->len || s[i] < '0' || s[i] > '9') {
        p->pos = i;
        fail(p, "expected a digit, found %s", found(p));
        return -1;
    }
    if (s[i] == '0') {
        i++;
        if (i < p->len && s[i] >= '0' && s[i] <= '9') {
            p->pos = i;
            fail(p, "leading zero in a number");
            return -1;
        }
    } else
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    if (i < p->len && s[i] == '.') {
        integral = false;
        i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9') {
            p->pos = i;
            fail(p, "expected a digit after the decimal point");
            return -1;
        }
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
        integral = false;
        i++;
        if (i < p->len && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9') {
            p->pos = i;
            fail(p, "expected a digit in the exponent");
            return -1;
        }
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    char buf[512];
    size_t n = i - start;
    if (n >= sizeof buf) {
        fail(p, "number too long");
        return -1;
    }
    memcpy(buf, s + start, n);
    buf[n] = 0;
    out->type = DG_JSON_NUMBER;
    out->number = strtod(buf, NULL);
    if (integral) {
        /* exact int64 parse with overflow detection */
        bool neg = buf[0] == '-';
        uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        out->is_int = true;
        for (const char *c = buf + neg; *c; c++) {
            uint64_t d = (uint64_t)(*c - '0');
            if (v > (lim - d) / 10) {
                out->is_int = false;
                break;
            }
            v = v * 10 + d;
        }
        if (out->is_int) out->integer = neg ? (int64_t)(0 - v) : (int64_t)v;
    }
    p->pos = i;
    return 0;
}

static int cmp_keys(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int append(parser *p, dg_json *arr, int *cap, bool with_key) {
    if (arr->n < *cap) return 0;
    int nc = *cap ? *cap * 2 : 8;
    dg_json *items = realloc(arr->items, (size_t)nc * sizeof *items);
    if (!items) {
        fail(p, "out of memory");
        return -1;
    }
    arr->items = items;
    if (with_key) {
        char **keys = realloc(arr->keys, (size_t)nc * sizeof *keys);
        if (!keys) {
            fail(p, "out of memory");
            return -1;
        }
        arr->keys = keys;
    }
    *cap = nc;
    return 0;
}

static int parse_array(parser *p, dg_json *out, int depth) {
    out->type = DG_JSON_ARRAY;
    int cap = 0;
    p->pos++; /* '[' */
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == ']') {
        p->pos++;
        return 0;
    }
    for (;;) {
        if (append(p, out, &cap, false)) return -1;
        memset(&out->items[out->n], 0, sizeof out->items[0]);
        out->n++;
        if (parse_value(p, &out->items[out->n - 1], depth + 1)) return -1;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->len && p->s[p->pos] == ']') {
            p->pos++;
            return 0;
        }
        fail(p, "expected ',' or ']' in an array, found %s", found(p));
        return -1;
    }
}

static int parse_object(parser *p, dg_json *out, int depth) {
    out->type = DG_JSON_OBJECT;
    int cap = 0;
    size_t open_pos = p->pos;
    p->pos++; /* '{' */
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == '}') {
        p->pos++;
        return 0;
    }
    for (;;) {
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != '"') {
            fail(p, "expected a string key in an object, found %s", found(p));
            return -1;
        }
        if (append(p, out, &cap, true)) return -1;
        char *key = parse_string(p);
        if (!key) return -1;
        out->keys[out->n] = key;
        memset(&out->items[out->n], 0, sizeof out->items[0]);
        out->n++;
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != ':') {
            fail(p, "expected ':' after the object key \"%.64s\", found %s", key, found(p));
            return -1;
        }
        p->pos++;
        if (parse_value(p, &out->items[out->n - 1], depth + 1)) return -1;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->len && p->s[p->pos] == '}') {
            p->pos++;
            break;
        }
        fail(p, "expected ',' or '}' in an object, found %s", found(p));
        return -1;
    }
    /* duplicate keys: sort a copy of the key pointers and compare neighbours */
    char **sorted = malloc((size_t)out->n * sizeof *sorted);
    if (!sorted) {
        fail(p, "out of memory");
        return -1;
    }
    memcpy(sorted, out->keys, (size_t)out->n * sizeof *sorted);
    qsort(sorted, (size_t)out->n, sizeof *sorted, cmp_keys);
    for (int i = 1; i < out->n; i++)
        if (!strcmp(sorted[i - 1], sorted[i])) {
            p->pos = open_pos;
            fail(p, "duplicate key \"%.64s\" in the object starting here", sorted[i]);
            free(sorted);
            return -1;
        }
    free(sorted);
    return 0;
}

static int literal(parser *p, const char *word) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) {
        fail(p, "unexpected %s (expected a JSON value)", found(p));
        return -1;
    }
    p->pos += n;
    return 0;
}

static int parse_value(parser *p, dg_json *out, int depth) {
    if (depth > MAX_DEPTH) {
        fail(p, "nesting deeper than %d levels", MAX_DEPTH);
        return -1;
    }
    skip_ws(p);
    if (p->pos >= p->len) {
        fail(p, "expected a value, found the end of the text");
        return -1;
    }
    unsigned char c = p->s[p->pos];
    switch (c) {
    case '{': return parse_object(p, out, depth);
    case '[': return parse_array(p, out, depth);
    case '"':
        out->type = DG_JSON_STRING;
        out->string = parse_string(p);
        return out->string ? 0 : -1;
    case 't':
        out->type = DG_JSON_BOOL;
        out->boolean = true;
        return literal(p, "true");
    case 'f':
        out->type = DG_JSON_BOOL;
        out->boolean = false;
        return literal(p, "false");
    case 'n': out->type = DG_JSON_NULL; return literal(p, "null");
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p, out);
        fail(p, "unexpected %s (expected a JSON value)", found(p));
        return -1;
    }
}

dg_json *dg_json_parse(const char *text, size_t len, char *err, size_t errlen) {
    parser p = {(const unsigned char *)text, len, 0, err, errlen, false};
    if (errlen) err[0] = 0;
    dg_json *root = calloc(1, sizeof *root);
    if (!root) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (parse_value(&p, root, 0) == 0) {
        skip_ws(&p);
        if (p.pos < p.len) fail(&p, "unexpected %s after the end of the JSON value", found(&p));
    }
    if (p.failed) {
        dg_json_free(root);
        return NULL;
    }
    return root;
}

const dg_json *dg_json_get(const dg_json *obj, const char *key) {
    if (!obj || obj->type != DG_JSON_OBJECT) return NULL;
    for (int i = 0; i < obj->n; i++)
        if (!strcmp(obj->keys[i], key)) return &obj->items[i];
    return NULL;
}

const char *dg_json_type_name(dg_json_type t) {
    static const char *const names[] = {"null", "boolean", "number", "string", "array", "object"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

int dg_json_write_string(FILE *f, const char *s) {
    size_t len = strlen(s);
    if (!dg_utf8_valid(s, len)) return -1;
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        switch (*c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (*c < 0x20) fprintf(f, "\\u%04x", *c);
            else fputc(*c, f);
        }
    }
    fputc('"', f);
    return 0;
}
