/*
 * The floor of a decode step's round trip on the machine it runs on: the
 * least any server pays, beyond its computation, for the exchange attnd's
 * step makes.
 *
 *   decode_floor STREAM_BYTES ANSWER_BYTES [codec]
 *
 * Listens on a free loopback port (printed on stdout, one line), takes one
 * connection and answers its HTTP/1.1 requests, one after another, as
 * bluntly as a server can; it exits when that connection closes. It reads
 * a request to its Content-Length with one blocking recv after another
 * (nothing parsed beyond that: a request sent before the last one's answer,
 * or a header not spelled "Content-Length", closes the connection), then
 * reads
 * STREAM_BYTES of memory with two threads (its "computation": a sum of
 * 64-bit words, what a decode step over a large KV cache does to the CPU's
 * caches and cores), then writes ANSWER_BYTES of JSON with one sendmsg:
 *
 *   {"meta":{"timing_ms":{"compute":C,"total":T}},"pad":"xxxx..."}
 *
 * C is the stream's time, in ms as attnd's meta.timing_ms.compute, so that
 * bench/decode_http.py times both servers with one client (T, from the
 * request's last byte read to the answer made, is there because the client
 * reads a total; attnd's counts from the request's headers). Round trip -
 * compute is then, for this program, what the machine's loopback, its
 * wake-ups and its caches cost after such a stream, with no JSON decoded,
 * no HTTP library, and its one hand-off (waking the helper) inside the
 * stream's clock. attnd's step pays that and its own part (reading the
 * body in pieces, decoding, handing the step to a worker and the answer
 * back to the I/O thread, encoding).
 *
 * With "codec", it also does what the step's wire format asks of any
 * server, with attnd's own JSON codec (api/json/, build/libcodec.a): before
 * the stream it validates the body and decodes its "q", "k" and "v" (base64
 * or numbers), and after it answers {"output": ..., "meta": ...}, the output
 * being q's values in q's shape as base64 float32 (what attnd answers for a
 * step with "output_encoding": "base64"), so ANSWER_BYTES is not used. Its
 * round trip - compute is then the machine's floor plus decoding and
 * encoding: what is left of attnd's figure beyond it is the rest of attnd's
 * way (libmicrohttpd's turns, the hand-offs to a worker and back, the
 * checks and the cache's bookkeeping). A body it cannot read closes the
 * connection and ends the program with status 1, the codec's message on
 * stderr.
 *
 * Threads: the accepting thread streams the first half, one helper the
 * second; the helper blocks between requests, as attnd's do.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "json/codec.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The memory streamed: words[0, n) in two halves. */
static uint64_t *words;
static size_t n_words;
static volatile uint64_t sums[2]; /* kept, so the reads are not elided */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static unsigned long posted, finished; /* streams asked of the helper, done by it */

static void stream_half(int half)
{
    size_t from = half == 0 ? 0 : n_words / 2, to = half == 0 ? n_words / 2 : n_words;
    uint64_t s[8] = {0};
    size_t i = from;
    for (; i + 8 <= to; i += 8)
        for (int j = 0; j < 8; j++)
            s[j] += words[i + j];
    for (; i < to; i++)
        s[0] += words[i];
    sums[half] = s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

static void *helper_main(void *arg)
{
    (void)arg;
    unsigned long done = 0;
    for (;;) {
        pthread_mutex_lock(&lock);
        while (posted == done)
            pthread_cond_wait(&changed, &lock);
        pthread_mutex_unlock(&lock);
        stream_half(1);
        pthread_mutex_lock(&lock);
        finished = ++done;
        pthread_cond_broadcast(&changed);
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}

/* Both halves, the helper woken for the second. */
static void stream_all(void)
{
    pthread_mutex_lock(&lock);
    unsigned long want = ++posted;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
    stream_half(0);
    pthread_mutex_lock(&lock);
    while (finished != want)
        pthread_cond_wait(&changed, &lock);
    pthread_mutex_unlock(&lock);
}

/* Reads one request whole into buf (cap bytes): its body is
 * buf[*body_at, *len). False when the client has gone or sent what this
 * program does not read. */
static bool read_request(int fd, char *buf, size_t cap, size_t *body_at, size_t *len)
{
    size_t got = 0, total = 0;
    for (;;) {
        ssize_t n = recv(fd, buf + got, cap - got, 0);
        if (n <= 0)
            return false;
        got += (size_t)n;
        if (total == 0) {
            char *end = memmem(buf, got, "\r\n\r\n", 4);
            if (end != NULL) {
                char *length = memmem(buf, (size_t)(end - buf), "Content-Length:", 15);
                *body_at = (size_t)(end + 4 - buf);
                total = *body_at + (length ? strtoul(length + 15, NULL, 10) : 0);
                if (total > cap)
                    return false;
            }
        }
        if (total != 0 && got >= total) {
            *len = got;
            return got == total;
        }
        if (got == cap)
            return false;
    }
}

/* Writes head and body, in one sendmsg unless a signal cuts it short. */
static bool send_answer(int fd, const char *head, size_t head_len, const char *body,
                        size_t body_len)
{
    size_t sent = 0, total = head_len + body_len;
    while (sent < total) {
        size_t of_head = sent < head_len ? sent : head_len, of_body = sent - of_head;
        struct iovec parts[2] = {{(void *)(head + of_head), head_len - of_head},
                                 {(void *)(body + of_body), body_len - of_body}};
        struct msghdr msg = {.msg_iov = parts, .msg_iovlen = 2};
        ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (n <= 0)
            return false;
        sent += (size_t)n;
    }
    return true;
}

/* The request's q, k and v, decoded from its body by attnd's codec; false,
 * with the codec's message on stderr, when the body is not valid JSON with
 * a decodable q. */
static bool decode_body(const char *body, size_t len, codec_tensor qkv[3])
{
    codec_span spans[16];
    codec_member members[16];
    size_t count = 0;
    codec_doc doc;
    codec_error err = {0};
    memset(qkv, 0, 3 * sizeof *qkv);
    bool ok = codec_doc_validate(&doc, body, len, spans, 16, &err);
    if (ok) {
        ok = codec_doc_members(&doc, members, 16, &count, "", &err);
        /* keys are unique after decoding (codec_doc_members); a key with
         * a NUL in it is key_too_long, no field */
        static const char *const names[3] = {"q", "k", "v"};
        for (size_t i = 0; ok && i < count; i++)
            for (int j = 0; j < 3; j++)
                if (!members[i].key_too_long && strcmp(members[i].key, names[j]) == 0)
                    ok = codec_doc_tensor(&doc, members[i].value, members[i].value_end,
                                          names[j], false, &qkv[j], &err);
        codec_doc_free(&doc);
    }
    if (ok && qkv[0].f32 == NULL) {
        ok = false;
        snprintf(err.message, sizeof err.message, "no float32 q");
    }
    if (!ok) {
        fprintf(stderr, "decode_floor: %s\n", err.message);
        for (int i = 0; i < 3; i++)
            codec_tensor_free(&qkv[i]);
    }
    return ok;
}

/* An answer's meta: the stream's and the whole request's milliseconds. */
#define TIMING "{\"timing_ms\":{\"compute\":%.6f,\"total\":%.6f}}"

/* With `codec`, each body is decoded and the answer encoded by attnd's
 * codec; otherwise ANSWER_BYTES of padding are answered. False when a body
 * could not be decoded or an answer made (the client's leaving is no
 * failure). */
static bool serve(int fd, char *request, size_t cap, char *answer, size_t answer_bytes,
                  bool codec)
{
    size_t body_at, len;
    while (read_request(fd, request, cap, &body_at, &len)) {
        double t_read = now_s();
        codec_tensor qkv[3];
        if (codec && !decode_body(request + body_at, len - body_at, qkv))
            return false;
        double t0 = now_s();
        stream_all();
        double t1 = now_s();
        const char *text = answer;
        size_t text_len = answer_bytes;
        codec_buf out = {0};
        if (codec) {
            codec_buf_puts(&out, "{\"output\":");
            codec_tensor_encode(&out, qkv[0].f32, qkv[0].rank, qkv[0].shape, CODEC_ENC_BASE64);
            codec_buf_printf(&out, ",\"meta\":" TIMING "}", (t1 - t0) * 1e3,
                             (now_s() - t_read) * 1e3);
            for (int i = 0; i < 3; i++)
                codec_tensor_free(&qkv[i]);
            if (out.failed) {
                fprintf(stderr, "decode_floor: out of memory for an answer\n");
                codec_buf_free(&out);
                return false;
            }
            text = out.data;
            text_len = out.len;
        } else {
            int head = snprintf(answer, answer_bytes, "{\"meta\":" TIMING ",\"pad\":\"",
                                (t1 - t0) * 1e3, (now_s() - t_read) * 1e3);
            memset(answer + head, 'x', answer_bytes - (size_t)head - 2);
            memcpy(answer + answer_bytes - 2, "\"}", 2);
        }
        char status[128];
        int status_len = snprintf(status, sizeof status,
                                  "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                  "Content-Length: %zu\r\n\r\n",
                                  text_len);
        bool sent = send_answer(fd, status, (size_t)status_len, text, text_len);
        codec_buf_free(&out);
        if (!sent)
            return true;
    }
    return true;
}

int main(int argc, char **argv)
{
    bool codec = argc == 4 && strcmp(argv[3], "codec") == 0;
    if (argc != 3 && !codec) {
        fprintf(stderr, "usage: decode_floor STREAM_BYTES ANSWER_BYTES [codec]\n");
        return 2;
    }
    size_t stream_bytes = strtoull(argv[1], NULL, 10);
    size_t answer_bytes = strtoull(argv[2], NULL, 10);
    if (stream_bytes < 64 || answer_bytes < 128 || answer_bytes > (64u << 20)) {
        fprintf(stderr, "decode_floor: STREAM_BYTES >= 64, ANSWER_BYTES in [128, 64 MiB]\n");
        return 2;
    }
    n_words = stream_bytes / sizeof *words;
    words = malloc(n_words * sizeof *words);
    size_t cap = 16u << 20;
    char *request = malloc(cap), *answer = malloc(answer_bytes);
    if (words == NULL || request == NULL || answer == NULL) {
        fprintf(stderr, "decode_floor: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < n_words; i++)
        words[i] = i; /* every page touched before the first request */
    pthread_t helper;
    if (pthread_create(&helper, NULL, helper_main, NULL) != 0) {
        fprintf(stderr, "decode_floor: cannot start the helper\n");
        return 1;
    }

    int listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t addr_len = sizeof addr;
    if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        listen(listener, 16) != 0 ||
        getsockname(listener, (struct sockaddr *)&addr, &addr_len) != 0) {
        perror("decode_floor: listen");
        return 1;
    }
    printf("%d\n", ntohs(addr.sin_port));
    fflush(stdout);
    int fd = accept(listener, NULL, NULL);
    if (fd < 0) {
        perror("decode_floor: accept");
        return 1;
    }
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    bool served = serve(fd, request, cap, answer, answer_bytes, codec);
    close(fd);
    return served ? 0 : 1;
}
