/*
 * The node link's messages and the coordinator's table of nodes (docs/cluster-protocol.md,
 * "The agent protocol"). Every message is one frame of src/net (frame.h): its `type` byte is
 * one of RK_NODE_MSG_*, its payload a few `key=value` lines, parsed here with fixed bounds
 * and nothing allocated (so every parser is fuzzed: fuzz/fuzz_nodes.c).
 *
 * The table (rk_nodes) is the coordinator's side: it listens on one address, accepts agents,
 * opens every frame through src/net (tag, job, ends, generation, sequence), answers HELLO
 * with WELCOME and PING with PONG, and reports each node's events (joined, lost, back,
 * refused) through a callback. Poll-based, single-threaded, no thread of its own: the caller
 * calls rk_nodes_poll in its loop. Memory is bounded: at most RK_NODES_MAX nodes, and at
 * most RK_NODES_PENDING_MAX connections that have not yet said who they are (each closed
 * after RK_NODES_HELLO_TIMEOUT_S without an authenticated HELLO).
 */
#ifndef RK_CLUSTER_NODES_H
#define RK_CLUSTER_NODES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/net.h"
#include "net/secret.h"
#include "rekindle/error.h"

/* ---- the messages ------------------------------------------------------------------------ */

enum {
    RK_NODE_MSG_HELLO = 1,   /* agent -> coordinator: who it is (rk_node_hello) */
    RK_NODE_MSG_WELCOME = 2, /* coordinator -> agent: accepted (rk_node_welcome) */
    RK_NODE_MSG_PING = 3,    /* agent -> coordinator: alive (empty payload) */
    RK_NODE_MSG_PONG = 4,    /* coordinator -> agent: the answer (empty payload) */
    RK_NODE_MSG_BYE = 5,     /* either way: the sender is done (rk_node_reason) */
    RK_NODE_MSG_REFUSED = 6, /* coordinator -> agent: not accepted, then closed (rk_node_reason) */
    /* the job's launches (jobmsg.c, docs/cluster-protocol.md "Launching the ranks") */
    RK_NODE_MSG_LAUNCH = 7, /* coordinator -> agent: start this node's ranks (rk_node_launch) */
    RK_NODE_MSG_LAUNCHED =
        8,                /* agent -> coordinator: started; the port it picked (rk_node_launched) */
    RK_NODE_MSG_OPEN = 9, /* agent -> coordinator: a rank connected (rk_node_open) */
    RK_NODE_MSG_DATA = 10,   /* either way: bytes of a rank's heartbeat stream (rk_node_data) */
    RK_NODE_MSG_CLOSE = 11,  /* either way: that stream ended (rk_node_data, no bytes) */
    RK_NODE_MSG_EXITED = 12, /* agent -> coordinator: the node's ranks are gone (rk_node_exited) */
    RK_NODE_MSG_KILL = 13,   /* coordinator -> agent: end this node's ranks (rk_node_kill) */
    RK_NODE_MSG_HEALTH = 14, /* agent -> coordinator: one GPU's reading (rk_node_health) */
    /* a hung rank's stacks (docs/cluster-protocol.md "Stacks of a hung rank") */
    RK_NODE_MSG_STACKS = 15,    /* coordinator -> agent: dump this rank's (rk_node_stacks) */
    RK_NODE_MSG_STACK = 16,     /* agent -> coordinator: bytes of the dump (as DATA) */
    RK_NODE_MSG_STACK_END = 17, /* agent -> coordinator: the dump is complete (as CLOSE) */
    /* the job's progress, for a simulated fleet that ages with it (docs/cluster-protocol.md
     * "Health") */
    RK_NODE_MSG_PROGRESS = 18, /* coordinator -> agent: steps the job has done (rk_node_progress) */
    /* partner copies of the ranks' snapshots (docs/recovery.md "Partner copies"): an agent
     * sends a generation to the coordinator, which relays it to the holder's agent */
    RK_NODE_MSG_SNAP_BEGIN = 19, /* agent <-> coordinator: a generation follows (rk_node_snap) */
    RK_NODE_MSG_SNAP_DATA = 20,  /* agent <-> coordinator: its bytes (rk_node_snap_data_parse) */
    RK_NODE_MSG_SNAP_END = 21,   /* agent <-> coordinator: it is complete (rk_node_snap) */
    RK_NODE_MSG_SNAP_HELD = 22,  /* agent -> coordinator: a generation received and kept */
    RK_NODE_MSG_SNAP_FETCH = 23, /* coordinator -> agent: send a generation it holds */
    RK_NODE_MSG_SNAP_MEM = 24    /* agent -> coordinator: the node's snapshot memory */
};
#define RK_NODE_MSG_LAST RK_NODE_MSG_SNAP_MEM

#define RK_NODES_MAX 1024         /* nodes of one job */
#define RK_NODE_PAYLOAD_MAX 1024  /* bytes of one message's payload */
#define RK_NODE_LINES_MAX 16      /* key=value lines in one payload */
#define RK_NODE_KEY_MAX 16        /* bytes of a key: [a-z_]{1,16} */
#define RK_NODE_VALUE_MAX 255     /* bytes of a value: UTF-8, no control characters */
#define RK_NODE_HOST_MAX 256      /* a host name (253 bytes) with its NUL */
#define RK_NODE_BOOT_ID_LEN 36    /* /proc/sys/kernel/random/boot_id: a UUID, lower case */
#define RK_NODE_REASON_MAX 256    /* a BYE's or REFUSED's reason with its NUL */
#define RK_NODES_PENDING_MAX 16   /* connections without an authenticated HELLO yet */
#define RK_NODES_SNDBUF (1 << 20) /* SO_SNDBUF of a node's connection, both ends (fixed) */
#define RK_NODES_BYE_WAIT_S 2.0   /* after BYE, how long the agents have to close their ends */
#define RK_NODES_RCVBUF                                                                            \
    (256 << 10) /* SO_RCVBUF of a node's connection (partner copies wait in the agent) */
#define RK_NODES_HELLO_TIMEOUT_S 5. /* how long such a connection may stay silent */
#define RK_NODES_HUSH_N 5           /* REFUSED events of such connections a window ... */
#define RK_NODES_HUSH_S 10.         /* ... of this many seconds (the rest: one HUSHED) */

/* A name for a message type ("HELLO"), "type N" for another value (into a static buffer for
 * those: not thread-safe then). */
const char *rk_node_msg_name(uint8_t type);

/* One payload's lines: keys and values point into the payload (not NUL-terminated). */
typedef struct rk_node_kv {
    size_t n;
    struct {
        const char *key, *val;
        size_t key_len, val_len;
    } line[RK_NODE_LINES_MAX];
} rk_node_kv;

/* Split `len` bytes into `key=value` lines: each ends with '\n' (the last one too), the key
 * is [a-z_]{1,16}, the value up to 255 bytes of UTF-8 without control characters, no key
 * twice, at most 16 lines and RK_NODE_PAYLOAD_MAX bytes. RK_EFORMAT with the line and the
 * problem otherwise ("line 2: no '='"); the message never quotes a value. */
int rk_node_kv_parse(rk_node_kv *kv, const void *payload, size_t len, rk_err *err);

typedef struct rk_node_hello {
    uint32_t node;                         /* node index */
    char host[RK_NODE_HOST_MAX];           /* the agent's host name (gethostname) */
    int64_t pid;                           /* the agent's pid */
    char boot_id[RK_NODE_BOOT_ID_LEN + 1]; /* the host's boot id: a new one after a reboot */
    /* the job's snapshot directory on this node (rk_snap_dir_make: an absolute path without
     * ',' or '=', at most RK_NODE_VALUE_MAX bytes), "" none: optional key snap */
    char snap[RK_NODE_VALUE_MAX + 1];
} rk_node_hello;

typedef struct rk_node_welcome {
    uint32_t node;       /* the node index accepted (the HELLO's) */
    uint32_t generation; /* the launch generation (also in every frame's header) */
    double timeout_s;    /* the coordinator's --node-timeout: ping more often than that */
} rk_node_welcome;

typedef struct rk_node_reason {
    char reason[RK_NODE_REASON_MAX]; /* one line for people ("done", "node 7 is not in this job") */
} rk_node_reason;

/* Format into out[cap] (RK_NODE_PAYLOAD_MAX suffices): *len bytes. RK_EINVAL for a field
 * the parser would refuse (a host name with a newline, a boot id that is not a UUID). */
int rk_node_hello_format(const rk_node_hello *h, char *out, size_t cap, size_t *len, rk_err *err);
int rk_node_welcome_format(const rk_node_welcome *w, char *out, size_t cap, size_t *len,
                           rk_err *err);
/* The reason is cleaned for one line (base/text.h) and cut to fit. */
int rk_node_reason_format(const rk_node_reason *r, char *out, size_t cap, size_t *len, rk_err *err);

/* Parse a payload: RK_EFORMAT naming the field and the problem ("hello: boot_id is not a
 * UUID"); unknown keys are ignored (a later version may add some); *out is zeroed first. */
int rk_node_hello_parse(const void *payload, size_t len, rk_node_hello *h, rk_err *err);
int rk_node_welcome_parse(const void *payload, size_t len, rk_node_welcome *w, rk_err *err);
int rk_node_reason_parse(const void *payload, size_t len, rk_node_reason *r, rk_err *err);

struct rk_net_peer; /* net/peer.h */
/* Send a BYE or REFUSED (`type`) with `reason` (formatted as rk_node_reason_format) on fd,
 * sealed with p's counters: the one way either end says why it ends a link. RK_OK, or the
 * send's error (net/peer.h: rk_net_peer_send, `to` naming the peer). */
int rk_node_send_reason(struct rk_net_peer *p, const rk_net_secret *key, int fd, uint8_t type,
                        const char *reason, const char *to, rk_err *err);

/* snprintf into out[cap] at *len, advancing *len; false when it does not fit. */
__attribute__((format(printf, 4, 5))) bool rk_node_put(char *out, size_t cap, size_t *len,
                                                       const char *fmt, ...);
/* The value of `key` in kv (NULL if absent, its length in *vlen); a whole number of digits in
 * [lo, hi] (no sign, no leading zero): RK_EFORMAT "WHAT: KEY is ..." otherwise. */
const char *rk_node_kv_get(const rk_node_kv *kv, const char *key, size_t *vlen);
int rk_node_kv_int(const rk_node_kv *kv, const char *what, const char *key, int64_t lo, int64_t hi,
                   int64_t *out, rk_err *err);

/* ---- the launch messages (jobmsg.c) ------------------------------------------------------ */

#define RK_NODE_DATA_MAX 1000 /* bytes of a heartbeat stream in one DATA */
#define RK_NODE_LIST_MAX 256  /* a device or injection list with its NUL */

typedef struct rk_node_launch {
    uint32_t launch;                /* the coordinator's launch number (>= 1) */
    uint32_t world;                 /* WORLD_SIZE */
    uint32_t base;                  /* the global rank of this node's first rank */
    uint32_t ranks;                 /* ranks on this node (LOCAL_WORLD_SIZE), >= 1 */
    char master[RK_NODE_HOST_MAX];  /* MASTER_ADDR: rank 0's host */
    uint32_t port;                  /* MASTER_PORT; 0: rank 0's agent picks one (LAUNCHED) */
    char devices[RK_NODE_LIST_MAX]; /* this node's device ids for its ranks, "0,1" */
    char done[RK_NODE_LIST_MAX];    /* RK_INJECT_DONE: injections that fired ("" none) */
    uint32_t watch;                 /* 1: another launcher (mpirun) starts the ranks; the agent
                                     * watches those that connect to its abstract socket */
    uint32_t snap_off;              /* 1: snapshots in memory are off for the rest of the job:
                                     * the agent removes its snapshot directory (key snap_off,
                                     * optional, 0 when absent) */
} rk_node_launch;

typedef struct rk_node_launched {
    uint32_t launch;
    uint32_t port; /* the MASTER_PORT picked, 0 if none was asked for */
} rk_node_launched;

typedef struct rk_node_open {
    uint32_t launch;
    uint32_t chan; /* the stream's number, the agent's choice (>= 1) */
    int64_t pid;   /* the rank process's own pid, as the agent's kernel named it */
} rk_node_open;

typedef struct rk_node_exited {
    uint32_t launch;
    uint32_t status; /* the node's keeper's status: an exit status, 128 + N for signal N */
    int64_t failed;  /* the global rank whose failure ended the node's others, -1 none */
} rk_node_exited;

typedef struct rk_node_kill {
    uint32_t launch;
    double grace_s; /* SIGTERM, then SIGKILL after this long */
} rk_node_kill;

int rk_node_launch_format(const rk_node_launch *m, char *out, size_t cap, size_t *len, rk_err *err);
int rk_node_launch_parse(const void *payload, size_t len, rk_node_launch *m, rk_err *err);
int rk_node_launched_format(const rk_node_launched *m, char *out, size_t cap, size_t *len,
                            rk_err *err);
int rk_node_launched_parse(const void *payload, size_t len, rk_node_launched *m, rk_err *err);
int rk_node_open_format(const rk_node_open *m, char *out, size_t cap, size_t *len, rk_err *err);
int rk_node_open_parse(const void *payload, size_t len, rk_node_open *m, rk_err *err);
int rk_node_exited_format(const rk_node_exited *m, char *out, size_t cap, size_t *len, rk_err *err);
int rk_node_exited_parse(const void *payload, size_t len, rk_node_exited *m, rk_err *err);
/* HEALTH: what the agent's health gate read for one GPU of its node (docs/cluster-protocol.md,
 * "Health"): sent after WELCOME and then every --health-interval, one message a device. */
typedef struct rk_node_health {
    uint32_t device;                 /* its index on the node (0 .. slots-1) */
    uint32_t score;                  /* 0..100, the health score */
    uint32_t lost;                   /* 1: the GPU is gone (off the bus, not found) */
    uint32_t sim;                    /* 1: a simulated GPU */
    int64_t prob_ppm;                /* the predictor's probability of failing, parts per
                                      * million; -1: no predictor */
    char why[RK_NODE_VALUE_MAX + 1]; /* the score's reason, "" none */
} rk_node_health;

int rk_node_health_format(const rk_node_health *m, char *out, size_t cap, size_t *len, rk_err *err);
int rk_node_health_parse(const void *payload, size_t len, rk_node_health *m, rk_err *err);
/* STACKS: the coordinator asks for a hung rank's stacks: the rank on channel `chan` of launch
 * `launch` is global rank `rank` (the dump's file name). The agent answers with STACK frames
 * (the dump's bytes, a channel number then 1 to RK_NODE_DATA_MAX bytes, as DATA) and one
 * STACK_END (the channel number alone, as CLOSE). */
typedef struct rk_node_stacks {
    uint32_t launch, chan, rank;
} rk_node_stacks;

int rk_node_stacks_format(const rk_node_stacks *m, char *out, size_t cap, size_t *len, rk_err *err);
int rk_node_stacks_parse(const void *payload, size_t len, rk_node_stacks *m, rk_err *err);
int rk_node_kill_format(const rk_node_kill *m, char *out, size_t cap, size_t *len, rk_err *err);
int rk_node_kill_parse(const void *payload, size_t len, rk_node_kill *m, rk_err *err);
/* PROGRESS: the steps the job has done since it began (never fewer than the last one said):
 * an agent whose simulated fleet ages with the job's steps (--sim-step-time) reads it at
 * them. `steps=N`, 0 <= N <= 2^62. */
typedef struct rk_node_progress {
    int64_t steps;
} rk_node_progress;

int rk_node_progress_format(const rk_node_progress *m, char *out, size_t cap, size_t *len,
                            rk_err *err);
int rk_node_progress_parse(const void *payload, size_t len, rk_node_progress *m, rk_err *err);
/* DATA and CLOSE: a 4-byte channel number (big-endian, >= 1), then DATA's bytes (1 to
 * RK_NODE_DATA_MAX; CLOSE none). */
int rk_node_data_format(uint32_t chan, const void *bytes, size_t n, uint8_t *out, size_t cap,
                        size_t *len, rk_err *err);
/* SNAP_BEGIN and SNAP_END: one generation of one rank's snapshot, sent in SNAP_DATA pieces
 * between them. `xfer` names the transfer (the sender's number, >= 1); `kind` what it is for:
 * RK_NODE_SNAP_PUSH (a node's own rank's pinned generation, to be held by its partner) or
 * RK_NODE_SNAP_FETCH (a held copy, sent back to become the rank's generation on the node it
 * will run on); `node` the node whose rank it is (the origin); `rank`, `step` the generation;
 * `bytes` its size, 1..RK_NODE_SNAP_BYTES_MAX. SNAP_END repeats all of them. SNAP_HELD (the
 * receiver kept it: the same fields, its xfer the coordinator's) and SNAP_FETCH (send the held
 * copy of `rank`, `step`, `bytes` of node `node` back as transfer `xfer`, kind fetch) use
 * them too (docs/cluster-protocol.md "Partner copies"). */
enum { RK_NODE_SNAP_PUSH = 0, RK_NODE_SNAP_FETCH = 1 };
#define RK_NODE_SNAP_XFER_FETCH                                                                    \
    0x80000000u                  /* the coordinator's fetch numbers have it; pushes not */
#define RK_NODE_SNAP_CHUNK 60000 /* bytes of a generation in one SNAP_DATA */
#define RK_NODE_SNAP_BYTES_MAX ((uint64_t)1 << 40) /* a generation's size */
typedef struct rk_node_snap {
    uint32_t xfer;
    uint32_t kind;
    uint32_t node;
    uint32_t rank;
    int64_t step;
    uint64_t bytes;
} rk_node_snap;
int rk_node_snap_format(const rk_node_snap *m, char *out, size_t cap, size_t *len, rk_err *err);
int rk_node_snap_parse(const void *payload, size_t len, rk_node_snap *m, rk_err *err);
/* SNAP_MEM: the bytes of the job's snapshots this node holds, `own` its ranks' generations
 * and pins (a pin counted once, as the hard link it is), `held` the partner copies it keeps
 * for other nodes' ranks; `own=N\nheld=N\n`, each 0..2^62. An agent says it when either
 * changed, at most once a second (docs/cluster-protocol.md "Partner copies"). */
#define RK_NODE_SNAP_MEM_MAX ((int64_t)1 << 62)
typedef struct rk_node_snap_mem {
    int64_t own, held;
} rk_node_snap_mem;
int rk_node_snap_mem_format(const rk_node_snap_mem *m, char *out, size_t cap, size_t *len,
                            rk_err *err);
int rk_node_snap_mem_parse(const void *payload, size_t len, rk_node_snap_mem *m, rk_err *err);
/* SNAP_DATA: a 4-byte transfer number (big-endian, >= 1), an 8-byte offset (big-endian) and
 * 1..RK_NODE_SNAP_CHUNK bytes of the generation from that offset. Format writes the header
 * into out[12]; parse points *bytes into the payload. RK_EFORMAT naming the problem. */
#define RK_NODE_SNAP_DATA_HDR 12
void rk_node_snap_data_header(uint32_t xfer, uint64_t off, uint8_t out[RK_NODE_SNAP_DATA_HDR]);
int rk_node_snap_data_parse(const void *payload, size_t len, uint32_t *xfer, uint64_t *off,
                            const uint8_t **bytes, size_t *n, rk_err *err);
int rk_node_data_parse(const void *payload, size_t len, int close, uint32_t *chan,
                       const uint8_t **bytes, size_t *n, rk_err *err);

/* A UUID as the kernel writes a boot id: 8-4-4-4-12 lower-case hex digits. */
bool rk_node_boot_id_ok(const char *s, size_t len);
/* 1 if s[0..len) may be a HELLO's snap: an absolute path of text, no ',' or '=' (the ranks'
 * RK_SNAP_DIRS lists them as HOST=DIR,...), at most RK_NODE_VALUE_MAX bytes. */
bool rk_node_snap_ok(const char *s, size_t len);

/* This host's boot id from `path` (NULL: /proc/sys/kernel/random/boot_id): at most 64 bytes
 * read, the trailing newline dropped, checked with rk_node_boot_id_ok. */
int rk_node_boot_id_read(const char *path, char out[RK_NODE_BOOT_ID_LEN + 1], rk_err *err);

/* A job id in its text form: 32 hex digits (either case) -> 16 bytes. RK_EFORMAT otherwise. */
int rk_node_job_parse(const char *text, uint8_t job[RK_NET_JOB_ID_LEN], rk_err *err);

/* "HOST:PORT" or "[V6]:PORT" into host[cap] and *port (0..65535, digits only). RK_EINVAL. */
int rk_node_hostport_parse(const char *s, char *host, size_t cap, uint16_t *port, rk_err *err);

/* ---- the coordinator's table ------------------------------------------------------------- */

typedef enum rk_node_event_kind {
    RK_NODE_JOINED,    /* first HELLO of this node */
    RK_NODE_LOST,      /* silent for the timeout, or its connection closed */
    RK_NODE_REJOINED,  /* back after a loss, same boot id */
    RK_NODE_REBOOTED,  /* back after a loss, another boot id */
    RK_NODE_RECONNECT, /* a new connection replaced a live one (no loss in between) */
    RK_NODE_LEFT,      /* said BYE */
    RK_NODE_REFUSED,   /* a connection refused: wrong secret, replay, fenced, bad HELLO... */
    RK_NODE_HUSHED     /* `count` more connections without a node were refused in the window
                        * that ended, their REFUSED events not sent (a flood) */
} rk_node_event_kind;

typedef struct rk_node_event {
    rk_node_event_kind kind;
    int node;                   /* the node index, -1 where none is known (REFUSED) */
    char from[RK_NET_ADDR_MAX]; /* the peer's address */
    double silent_s;            /* LOST: seconds since its last frame */
    const char *host;           /* JOINED, REJOINED, REBOOTED: the HELLO's host name */
    const char *why;            /* LOST, REFUSED, LEFT: one line */
    int count;                  /* HUSHED: the refusals not reported one by one */
} rk_node_event;

/* "joined", "lost", ... */
const char *rk_node_event_name(rk_node_event_kind k);

/* What a node coming back is: REJOINED for the same boot id, REBOOTED otherwise. */
rk_node_event_kind rk_node_return_kind(const char *old_boot_id, const char *new_boot_id);

typedef struct rk_nodes_opts {
    const char *listen_host; /* the one address to listen on */
    uint16_t listen_port;    /* 0: the kernel picks (rk_nodes_port) */
    int nodes;               /* 1..RK_NODES_MAX: node indexes 0..nodes-1 */
    uint8_t job[RK_NET_JOB_ID_LEN];
    uint32_t generation; /* the launch generation (>= 1) */
    double timeout_s;    /* a node silent this long is lost */
    /* the window of the refusals' rate limit (RK_NODES_HUSH_N events, then a count); 0:
     * RK_NODES_HUSH_S */
    double refusals_window_s;
    void (*on_event)(void *ctx, const rk_node_event *e);
    /* LAUNCHED, OPEN, DATA, CLOSE, EXITED, HEALTH, STACK, STACK_END from node `node`
     * (authenticated, in order); NULL: they are refused as unexpected. It returns 0, or
     * nonzero when the caller takes no more this round: then no further message is handed
     * out until the next rk_nodes_poll, and the frames wait, in order, in their connection's
     * reader or its socket (the agent is held back by TCP, nothing is dropped, nothing grows);
     * a node whose frames wait is not timed out meanwhile. */
    int (*on_msg)(void *ctx, int node, uint8_t type, const uint8_t *payload, size_t len);
    void *ctx;
} rk_nodes_opts;

typedef struct rk_nodes rk_nodes;

/* Listen (net/sock.h: rk_net_listen's errors) and make the table; the secret is copied (and
 * wiped by rk_nodes_free). */
int rk_nodes_open(rk_nodes **out, const rk_nodes_opts *o, const rk_net_secret *key, rk_err *err);

/* The port listened on. */
uint16_t rk_nodes_port(const rk_nodes *t);

/* Hand out the frames held back at the last poll (on_msg was full), then wait up to
 * `timeout_s` for sockets (not at all while frames are still held back), accept, read, answer
 * and time nodes out; events go to on_event. RK_OK, or RK_EIO if poll itself fails. */
int rk_nodes_poll(rk_nodes *t, double timeout_s, rk_err *err);

/* Node `i`'s state: connected now, seconds since its last authenticated frame (-1: never). */
bool rk_nodes_connected(const rk_nodes *t, int i);
double rk_nodes_silent_s(const rk_nodes *t, int i);
int rk_nodes_count_connected(const rk_nodes *t);

/* Ask node `k` whether it is alive: a PING, which its agent answers with a PONG
 * (docs/cluster-protocol.md). Returns the probe's number (>= 1): rk_nodes_answered reaches
 * it once that PONG came; 0 if the node is not connected or the send failed (then it is
 * lost: its event is emitted first). */
uint64_t rk_nodes_probe(rk_nodes *t, int k);
/* How many of node `k`'s probes were answered (PONGs come in order, one a PING). */
uint64_t rk_nodes_answered(const rk_nodes *t, int k);

/* Send one message to node `k`: RK_ECOMM if it is not connected, or the send fails (then
 * the node is lost: its event is emitted first). */
int rk_nodes_send(rk_nodes *t, int k, uint8_t type, const void *payload, size_t len, rk_err *err);
/* Bytes node k's connection takes now without waiting (its socket's send buffer less what
 * waits in it); 0 when it is not connected. */
int64_t rk_nodes_room(const rk_nodes *t, int k);
/* Node `k`'s next agent is a new process (its host rebooted, or its agent died), started
 * with `--generation G`, G above the node's current one: its frames count from 1 again, and
 * every frame of the earlier process (an older generation) is refused from now on. */
void rk_nodes_renew(rk_nodes *t, int k, uint32_t generation);
/* Node `k`'s current generation. */
uint32_t rk_nodes_generation(const rk_nodes *t, int k);
/* The host name node `k` said in its HELLO, NULL before any. */
const char *rk_nodes_host(const rk_nodes *t, int k);
/* Node k's snapshot directory as its agent's latest HELLO said it; NULL if none was said. */
const char *rk_nodes_snap(const rk_nodes *t, int k);

/* Send BYE (`reason`) to every connected node, then close their connections. */
void rk_nodes_bye(rk_nodes *t, const char *reason);

/* Close everything and wipe the secret. NULL-safe. */
void rk_nodes_free(rk_nodes *t);

#endif
