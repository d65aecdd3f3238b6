/*
 * rk exporter (docs/exporter.md): this node's GPU health served to Prometheus. Two halves:
 *
 *   prom.c   the Prometheus text format 0.0.4 encoding of the node's GPU state: exactly the
 *            metric names, types, units and labels of docs/metrics.md (the contract alert rules
 *            and dashboards are built on). Pure functions over plain structs: no I/O.
 *   http.c   the exporter itself: a collector thread that reads every GPU each interval
 *            through the health monitor (rekindle/monitor.h: history, signals, the failure
 *            predictor's probability from predict/predict_online.h, score) and renders
 *            the whole /metrics text into a new buffer that it swaps in; and a libmicrohttpd
 *            server whose scrapes only hand out the latest text (/metrics, /healthz, /), with
 *            a reaper thread that enforces the connection limits below.
 *
 * Like the rest of the library, nothing here prints or exits: errors come back as RK_E* codes
 * with a message, and what the collector notices (a GPU below the threshold, lost, a failing
 * collection) goes to an optional callback that the caller prints.
 *
 *     rk_exporter_opts o = RK_EXPORTER_OPTS_DEFAULT;
 *     o.backend = "sim"; o.telemetry.sim_gpus = 8;
 *     rk_exporter *x;
 *     if (rk_exporter_start(&x, &o, &err)) return err.code;
 *     printf("listening on http://%s/metrics\n", rk_exporter_address(x));
 *     ... wait for SIGTERM ...
 *     rk_exporter_stop(x);
 */
#ifndef RK_EXPORTER_H
#define RK_EXPORTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"
#include "rekindle/health.h"
#include "rekindle/monitor.h"

/* ---- Prometheus text encoding (prom.c) ---------------------------------------------------- */

/* A growable text buffer. An allocation failure sets `failed` and makes later appends no-ops,
 * so a renderer checks once at the end. */
typedef struct rk_buf {
    char *p; /* NUL-terminated while not failed */
    size_t len, cap;
    bool failed;
} rk_buf;

void rk_buf_free(rk_buf *b);
/* Append `len` bytes / a printf-style string. */
void rk_buf_put(rk_buf *b, const char *s, size_t len);
void rk_buf_printf(rk_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* One GPU as the encoder sees it: what it is, its latest sample, the signals over its window
 * and its score with findings (filled by rk_prom_gpu_from_monitor, or by hand in tests).
 *
 *   sample.lost          rk_gpu_up 0, and only rk_gpu_info, rk_gpu_up and rk_gpu_health_score
 *   sample.valid == 0    the read failed this cycle: rk_gpu_up 0, rk_gpu_info, and the score
 *                        (of the last good reading) only if has_score
 *   otherwise            rk_gpu_up 1 and a series for every valid field and signal */
typedef struct rk_prom_gpu {
    rk_gpu_info info;
    rk_gpu_sample sample;
    bool has_signals;
    rk_gpu_signals sig;
    bool has_score;
    int score;
    int nfindings;
    rk_finding findings[RK_MAX_FINDINGS];
} rk_prom_gpu;

/* The exporter's own counters (rk_exporter_* metrics). A negative duration or a timestamp of
 * 0 or less leaves that series out. */
typedef struct rk_prom_stats {
    uint64_t collections, errors;
    double duration_s;
    double last_ts;
    int gpus;
} rk_prom_stats;

/* Fill g from what the health monitor says of one GPU (rekindle/monitor.h): its latest
 * reading, signals (with the predictor's probability, served as rk_gpu_failure_probability)
 * and score with findings. When this cycle's reading failed (m->current false) the sample is
 * empty (rk_gpu_up 0) and the score is the one of its last good reading, by the monitor's rule
 * (none before the first). */
void rk_prom_gpu_from_monitor(rk_prom_gpu *g, const rk_gpu_info *info, const rk_monitor_gpu *m);

/* Append the per-GPU metric families for n GPUs (HELP and TYPE once per family, then one
 * series per GPU in order; a family with no series is left out). Values that are not finite
 * (NaN, Inf) are treated as absent: no series. */
void rk_prom_render_gpus(rk_buf *b, const rk_prom_gpu *g, int n);
/* Append the rk_exporter_* families. */
void rk_prom_render_stats(rk_buf *b, const rk_prom_stats *s);

/* A sample value as Prometheus text: integers exactly ("42", "-3"), other values in the
 * shortest of %.15g / %.17g that reads back to the same double. Returns false (and writes
 * nothing useful) for NaN and infinities, which rekindle never exposes. cap >= 32. */
bool rk_prom_format_value(double v, char *buf, size_t cap);
/* Append a label value escaped for the text format: backslash, double quote and line feed
 * become \\, \" and \n; bytes that are not valid UTF-8 become U+FFFD. */
void rk_prom_escape_label(rk_buf *b, const char *s);

/* The Content-Type of what rk_prom_render_* produce. */
#define RK_PROM_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* ---- the exporter (http.c) ---------------------------------------------------------------- */

#define RK_EXPORTER_DEFAULT_PORT 9258
#define RK_EXPORTER_DEFAULT_LISTEN "127.0.0.1:9258"
#define RK_EXPORTER_PATH_MAX 1024 /* longer request paths get 414 */

typedef struct rk_exporter rk_exporter;

typedef struct rk_exporter_opts {
    const char *listen;  /* "ADDR:PORT", IPv6 as "[ADDR]:PORT"; port 0 picks a free one */
    double interval_s;   /* between collections: 0.1 .. 86400 */
    int history;         /* samples kept per GPU for signals: 2 .. 100000 */
    const char *backend; /* "nvml", "sim" or "auto" (rk_telemetry_open) */
    rk_telemetry_opts telemetry;
    double threshold; /* a GPU scoring below this is reported through on_event */
    /* The limits that keep slow and idle clients from blinding the server (docs/exporter.md,
     * "Limits"). A connection "waits" from when it opens, or its previous answer was sent,
     * until a whole request has arrived; then it is being answered.
     *   timeout_s        the total deadline: a connection that has not received its whole
     *                    request AND had its answer sent within timeout_s of starting to wait
     *                    is closed, however steadily it trickles bytes (1 .. 3600)
     *   max_per_client   open connections per client address (1 .. 65536); a new connection
     *                    over it closes that client's oldest waiting connection, preferring
     *                    one that never completed a request; a connection being answered is
     *                    never closed for it, so a client that sends its request promptly is
     *                    served however many connections it (or an attacker at its address)
     *                    holds open
     *   max_connections  the same over all clients (1 .. 65536) */
    unsigned max_connections;
    unsigned timeout_s;
    unsigned threads; /* HTTP worker threads (1 .. 64) */
    /* Called from the collector thread with one line (no newline) when something changes: a
     * GPU falls below the threshold or recovers, a GPU is lost, collection starts failing or
     * recovers. NULL for none. */
    void (*on_event)(void *ctx, const char *line);
    void *event_ctx;
    /* The failure predictor (predict/predict.h, a classification model over
     * RK_FLEET_FEATURES features), borrowed until rk_exporter_stop; NULL for none. Each cycle
     * feeds every GPU's reading to a rolling window of one row a minute
     * (predict/predict_online.h), on the simulator's clock for "sim" and the monotonic clock
     * otherwise; once a GPU has a full window its probability is served as
     * rk_gpu_failure_probability and enters its score, about the horizon the model file
     * records. */
    const struct rk_pred_model *predictor;
    unsigned max_per_client; /* see max_connections above */
} rk_exporter_opts;

#define RK_EXPORTER_OPTS_DEFAULT                                                                   \
    {                                                                                              \
        RK_EXPORTER_DEFAULT_LISTEN, 5.0, 60, "nvml", RK_TELEMETRY_OPTS_DEFAULT,                    \
            RK_HEALTH_THRESHOLD_DEFAULT, 512, 10, 2, NULL, NULL, NULL, 128                         \
    }

/* Bind the listening socket (first: a port in use is the likeliest mistake), open the
 * telemetry backend, run the first collection, then start serving and the collector thread.
 * Errors: RK_EINVAL (bad options or listen address), RK_ENOTSUP (NVML absent: the message says
 * so), RK_EIO (the address cannot be bound, e.g. in use: the message names it), RK_ENOMEM.
 * Nothing is left running on error. */
int rk_exporter_start(rk_exporter **out, const rk_exporter_opts *o, rk_err *err);
/* Stop serving (open connections are closed), stop and join the collector, close the
 * backend and free everything. NULL is a no-op. */
void rk_exporter_stop(rk_exporter *x);

/* The address actually bound, "127.0.0.1:9258" or "[::1]:9258" (with the real port when 0
 * was asked for). */
const char *rk_exporter_address(const rk_exporter *x);
/* The backend's name ("nvml", "sim"), how many GPUs it watches, and whether they are
 * simulated. */
const char *rk_exporter_backend(const rk_exporter *x);
int rk_exporter_gpus(const rk_exporter *x);
bool rk_exporter_simulated(const rk_exporter *x);

/* ---- connection limits (http.c; docs/exporter.md, "Limits") ----------------------------- */

/* One open connection as the limits see it. */
typedef struct rk_conn_state {
    double since; /* when it started waiting: opened, or its previous answer was sent */
    bool busy;    /* its whole request is in and is being answered */
    bool served;  /* it has completed a request before */
    bool closing; /* a limit has already closed it (it no longer counts) */
} rk_conn_state;

/* The policy behind max_per_client and max_connections, a pure function. `c` holds the n open
 * connections of one client (or of all clients), `fresh` the one just accepted. While more
 * than `cap` of them are not closing, one goes: the oldest waiting connection (not busy, not
 * closing, not `fresh`) that never completed a request; else the oldest waiting one that did
 * (an idle kept-alive connection); else `fresh` itself (every other one is being answered).
 * Returns its index, or -1 when the cap is not exceeded or nothing is left to close. */
long rk_exporter_pick_victim(const rk_conn_state *const *c, size_t n, size_t fresh, unsigned cap);

/* Parse "ADDR:PORT" / "[ADDR]:PORT" (numeric addresses only: no name lookups) into a socket
 * address. RK_EINVAL naming the problem. */
struct sockaddr_storage;
int rk_exporter_parse_listen(const char *s, struct sockaddr_storage *ss, unsigned *sslen,
                             rk_err *err);

#endif
