/* A small strict JSON (RFC 8259) parser into a tree, for safetensors headers and the checkpoint
 * config, plus a writer of JSON string literals.
 *
 * Strict: one value surrounded by optional whitespace; no trailing commas, comments, NaN,
 * leading zeros or '+' signs; strings are valid UTF-8 with no raw control characters; \u escapes
 * are decoded (surrogate pairs joined, lone surrogates and \u0000 rejected, so every string is a
 * C string); duplicate keys in an object are rejected; nesting is limited to 64 levels.  Errors
 * name the byte offset: "at byte 17: expected ':' after an object key". */
#ifndef DG_MODELS_JSON_H
#define DG_MODELS_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum { DG_JSON_NULL, DG_JSON_BOOL, DG_JSON_NUMBER, DG_JSON_STRING, DG_JSON_ARRAY, DG_JSON_OBJECT } dg_json_type;

typedef struct dg_json {
    dg_json_type type;
    bool boolean;
    double number;         /* every number */
    bool is_int;           /* written without fraction or exponent and fits in int64 */
    int64_t integer;       /* valid when is_int */
    char *string;          /* DG_JSON_STRING: NUL-terminated UTF-8 */
    int n;                 /* array items or object members */
    char **keys;           /* object member names (n of them), in file order */
    struct dg_json *items; /* n children, in file order */
} dg_json;

/* Parses text[0..len).  Returns the root (free it with dg_json_free), or NULL with a message in
 * err (which must hold errlen >= 1 bytes). */
dg_json *dg_json_parse(const char *text, size_t len, char *err, size_t errlen);
void dg_json_free(dg_json *j);
/* The member named key of an object, or NULL. */
const dg_json *dg_json_get(const dg_json *obj, const char *key);
const char *dg_json_type_name(dg_json_type t);

/* Writes s as a JSON string literal (quotes included).  Returns 0, or -1 if s is not valid UTF-8. */
int dg_json_write_string(FILE *f, const char *s);
/* Whether s is valid UTF-8 (no overlong forms, surrogates or code points past U+10FFFF). */
bool dg_utf8_valid(const char *s, size_t len);

#endif
