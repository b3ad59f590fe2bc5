/*
 * Shared-library helper for tests/fuzz/diff_nginx.py: frames the bytes of
 * one client connection with runtime/http1.c the way runtime/proxy.c does
 * (request head, then Content-Length or chunked body, then the next request
 * while the connection stays keep-alive) and reports where each request
 * ends. Built with http1.c into one .so and called through ctypes.
 *
 * Not here: anything nginx-specific; the comparison is in the script.
 */
#include "http1.h"

#include <stdio.h>
#include <string.h>

enum {
    SL_DIFF_END = 0,        /* every byte belongs to a framed request */
    SL_DIFF_INCOMPLETE = 1, /* the last request is cut short */
    SL_DIFF_REJECTED = 2,   /* a request was refused (status in *status) */
    SL_DIFF_CLOSED = 3,     /* stopped after a request that closes the connection */
};

/*
 * Returns the number of requests framed (their end offsets in ends[0..n)),
 * with *final one of the SL_DIFF_* states, *status the refusal status and
 * err its message.
 */
int sl_diff_frame(const char *buf, size_t len, size_t *ends, int max, int *final, int *status,
                  char *err, size_t errlen)
{
    static const sl_http1_limits_t limits = {8192, 32768, 100};
    sl_http1_header_t headers[100];
    size_t pos = 0;
    int n = 0;
    *status = 0;
    err[0] = '\0';
    while (n < max) {
        if (pos == len) {
            *final = SL_DIFF_END;
            return n;
        }
        sl_http1_request_t req;
        memset(&req, 0, sizeof(req));
        req.headers = headers;
        req.num_headers = 100;
        ssize_t r = sl_http1_parse_request(buf + pos, len - pos, &limits, &req);
        if (r == SL_AGAIN) {
            *final = SL_DIFF_INCOMPLETE;
            return n;
        }
        if (r < 0) {
            *final = SL_DIFF_REJECTED;
            *status = req.error_status ? req.error_status : 400;
            snprintf(err, errlen, "%s", req.error ? req.error : "");
            return n;
        }
        size_t end = pos + (size_t)r;
        if (req.body == SL_HTTP1_BODY_LENGTH) {
            if (req.content_length > len - end) {
                *final = SL_DIFF_INCOMPLETE;
                return n;
            }
            end += (size_t)req.content_length;
        } else if (req.body == SL_HTTP1_BODY_CHUNKED) {
            sl_http1_chunked_t c;
            sl_http1_chunked_init(&c);
            int done = 0;
            ssize_t b = sl_http1_chunked_scan(&c, buf + end, len - end, &done);
            if (b < 0) {
                *final = SL_DIFF_REJECTED;
                *status = 400;
                snprintf(err, errlen, "chunked body: %s", c.error ? c.error : "");
                return n;
            }
            if (!done) {
                *final = SL_DIFF_INCOMPLETE;
                return n;
            }
            end += (size_t)b;
        }
        ends[n++] = end;
        pos = end;
        if (!(req.flags & SL_HTTP1_F_KEEP_ALIVE)) {
            *final = pos == len ? SL_DIFF_END : SL_DIFF_CLOSED;
            return n;
        }
    }
    *final = SL_DIFF_END;
    return n;
}
