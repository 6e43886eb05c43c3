/*
 * JSON strings for everyone in attnd who writes JSON by hand: the one UTF-8
 * check and the one string escaper (api/ error bodies and messages, server/
 * log lines and /v1/info). Plain C: no allocation, no jansson, no api_buf,
 * so that server/ can use it without taking in the rest of the codec.
 */
#ifndef API_JSON_STRING_H
#define API_JSON_STRING_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Length of the well-formed UTF-8 sequence at s[0..avail) (avail >= 1): 1
 * for ASCII, 2..4 for a multi-byte sequence, 0 when the bytes there are not
 * one (Unicode 15, table 3-7: no overlong forms, no surrogates D800-DFFF,
 * nothing above U+10FFFF, no sequence cut short by avail).
 */
size_t json_utf8_sequence(const unsigned char *s, size_t avail);

/* Is s[0..n) well-formed UTF-8 (every sequence as json_utf8_sequence)? */
bool json_utf8_valid(const char *s, size_t n);

/* n, less a multi-byte sequence cut short at the end of s[0..n) (its lead
 * byte announces more bytes than follow): what is left of a text that a
 * fixed-size buffer cut mid-character. */
size_t json_utf8_uncut(const char *s, size_t n);

enum {
    /* Characters beyond ASCII as \uXXXX escapes (a surrogate pair above
     * U+FFFF), so that the text is ASCII, as Python's json.dumps writes by
     * default. Without it they are copied as UTF-8. */
    JSON_ESCAPE_ASCII = 1u,
};

/* The most bytes json_escape_text writes for n bytes of input (\u00XX for
 * a control character, \ufffd for a stray byte), without the NUL. */
#define JSON_ESCAPED_MAX(n) (6 * (size_t)(n))

/*
 * Writes s[0..n) as the inside of a JSON string (no quotes) at out[0..cap).
 * Every input gives valid JSON: '"' and '\\' are escaped, control characters
 * (U+0000..U+001F, DEL) as \b \f \n \r \t or \u00XX, U+2028 and U+2029 as
 * \u2028 / \u2029 (line breaks to JavaScript), and each byte that does not
 * start a well-formed UTF-8 sequence as U+FFFD (the replacement character),
 * so that NUL bytes and broken text in s can neither end nor break the
 * string. flags: JSON_ESCAPE_ASCII or 0.
 * Like snprintf: the output is NUL-terminated when cap > 0, cut only between
 * whole escapes or characters, and the return value is the length the whole
 * text needs (>= cap: it was cut).
 */
size_t json_escape_text(char *out, size_t cap, const char *s, size_t n, unsigned flags);

#endif /* API_JSON_STRING_H */
