/*
 * The coordinator's private state (src/cluster/ only: scripts/layers.txt), shared by the
 * files of the backend as SQLite's files share sqliteInt.h: cluster.c (the backend's ops, the
 * launch, a node's loss and blame: act), facts.c (what the node table's callbacks record, and
 * the facts and channels act takes) and agents.c (the agents' processes). Calls go from
 * cluster.c to the other two and from agents.c to facts.c, never back.
 */
#ifndef RK_CLUSTER_COORD_H
#define RK_CLUSTER_COORD_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cluster/cluster.h"
#include "cluster/nodes.h"
#include "net/secret.h"
#include "supervisor/backend.h"

#define MAX_NODES 256
#define MAX_CHANS 1024        /* the ranks' streams of one launch (rk run's connections) */
#define AGENT_EXIT_WAIT_S 3.0 /* an agent ends within this of BYE, or is killed */
/* The facts the callbacks record between two acts: past the FULL marks the node table hands
 * out no more messages that round (on_msg says it is full: the rest wait in their links); the
 * room above them is for the table's events (lines), which cannot wait. */
#define FACTS_MAX 1024
#define FACTS_FULL 512
#define FACT_BYTES_MAX (256 << 10)
#define FACT_BYTES_FULL (128 << 10)
#define FACT_LINE_MAX 1024 /* a line to say, with its NUL (>= RK_NODE_DATA_MAX) */

/* A rank's heartbeat stream relayed from its node: a socketpair whose other end the job reads
 * as a connection (sup_add_remote_conn). */
typedef struct chan {
    int node;    /* -1: a free entry */
    uint32_t id; /* the channel on the node's link */
    int relay;   /* our end, -1 once closed */
    int peer;    /* the job's end (its connection's fd) */
    /* its stacks asked of its agent (ask_stacks): the rank, bytes written so far, STACK_END */
    int stack_rank; /* -1: not asked */
    size_t stack_bytes;
    int stack_end;
} chan;

/* What a callback saw, for act(): take_facts acts on each, in the order they came. */
typedef enum fact_kind {
    FACT_SAY,       /* a line for the job's status (sup_say) */
    FACT_OPEN,      /* a rank's channel opened (open_chan) */
    FACT_DATA,      /* its bytes (relay_write) */
    FACT_CLOSE,     /* its stream ended */
    FACT_STACK,     /* bytes of its stack dump (sup_stack_append) */
    FACT_STACK_END, /* the dump is complete */
    FACT_SNAP       /* a partner copy's message (chan: its type), for partners.c */
} fact_kind;

typedef struct fact {
    fact_kind kind;
    int node;
    uint32_t chan;
    long pid;      /* OPEN: the rank's process */
    size_t off, n; /* DATA, STACK: the bytes in fact_bytes; SAY: the line, NUL included */
} fact;

/* A partner copy's transfer relayed (partners.c): from node `from` as its transfer `in`, to
 * node `to` as ours `out`. */
#define RELAYS_MAX 64
typedef struct relay {
    int used;
    int begun; /* its SNAP_BEGIN came */
    double t0; /* ... then */
    int from, to;
    uint32_t in, out;
    rk_node_snap m; /* as its SNAP_BEGIN said it (node: the rank's origin) */
} relay;

/* The coordinator's state, all of it (the job's is the supervisor's: it reaches it only
 * through backend.h's services). The node table's callbacks (facts.c: coord_on_event,
 * coord_on_msg) record what they saw here and call nothing outside it; act() (cluster.c) acts
 * on it once a round of the link, from pump and the waits (and the ops that send, through
 * coord_take_facts). Each group of fields says which file writes it; the others only read. */
struct sup_cluster {
    /* ---- configuration: written by cluster.c (open_cluster, close_cluster), read by all */
    const rk_sup_opts *o;
    struct sup *s; /* the job, from open on (NULL before) */
    rk_nodes *t;
    int watch; /* one mpirun (or srun) across the hosts starts the ranks; the agents watch */
    int srun;  /* in a Slurm allocation: srun starts the agents and the ranks */
    int snaps; /* the agents start their ranks with a snapshot directory of their node
                * (--snapshots; recovery from memory, docs/recovery.md "PyTorch jobs across
                * hosts"), every rank of a launch or none */
    int nnodes;
    uint8_t job[RK_NET_JOB_ID_LEN];
    char job_hex[2 * RK_NET_JOB_ID_LEN + 1];
    char addr[RK_NODE_HOST_MAX + 16];  /* what the agents connect to */
    rk_net_secret key;                 /* for the agents started later */
    int dev_node[RK_SUP_MAX_DEVICES];  /* device index -> node */
    int dev_local[RK_SUP_MAX_DEVICES]; /* ... its index on the node */
    /* ---- the agents' processes: agents.c */
    pid_t rsh[MAX_NODES];         /* the agent's rsh process, 0 none */
    double restart_at[MAX_NODES]; /* a node without an agent gets a new one then */
    double backoff[MAX_NODES];    /* ... and the wait after that one (doubling to 30 s) */
    /* ---- each node's failures and quarantine (policy.h): cluster.c (node_failure) */
    rk_sup_dev node[MAX_NODES];
    /* ---- this launch: reset by cluster.c (start); what its messages say (exited, status,
     * failed_rank, failure_seen, kill_due, launched_port, launched) recorded by facts.c
     * (coord_on_msg) and acted on by cluster.c (act, poll_launch, kill_launch) */
    int launch_no, n;
    int dev[RK_SUP_MAX_DEVICES]; /* rank -> device index */
    int used[MAX_NODES];         /* the node runs ranks of this launch */
    int exited[MAX_NODES];       /* ... and said EXITED (or was lost) */
    int first_rank[MAX_NODES];
    int status;             /* the launch's status so far: the first failure's, else 0/4 */
    int ended;              /* every node in use ended: status is the launch's */
    int failed_rank;        /* the first EXITED's failed rank, -1 none; read once */
    int failure_seen;       /* a node ended with a failure: the others are being ended */
    int kill_due;           /* ... recorded by on_msg: act() ends the others' ranks */
    uint32_t launched_port; /* LAUNCHED from rank 0's node */
    int launched;
    /* ---- the ranks' channels: facts.c (opened, relayed, closed); cluster.c empties the
     * table at start and marks a dump asked (ask_stacks) */
    chan chans[MAX_CHANS];
    int nchans;
    /* ---- nodes of this launch lost: 1 recorded by facts.c (coord_on_event), 2 acted on by
     * cluster.c (take_losses) */
    int lost[MAX_NODES];
    double lost_silent[MAX_NODES]; /* ... seconds since its last frame */
    char lost_why[MAX_NODES][200]; /* ... and why, for the incident */
    /* ---- a failure of this launch weighed against the nodes: cluster.c (weigh_failure) */
    int node_failed; /* a node's loss is this launch's failure (sup_fail_node) */
    int probing;     /* every node of the launch was asked (PING) at probed_at */
    double probed_at;
    uint64_t probe[MAX_NODES]; /* ... each node's probe number (rk_nodes_probe) */
    int decided;               /* the blame is known: a later loss changes no verdict */
    /* ---- the agents' health readings (HEALTH), by device index, with --health only:
     * recorded by facts.c; the worst since the last look forgotten by cluster.c (health) */
    struct dev_health {
        int have; /* a reading came */
        int sim;
        rk_sup_health h;
        char why[RK_NODE_VALUE_MAX + 1];
        int have_worst; /* the worst of the readings since the last look (health) */
        rk_sup_health worst;
        char worst_why[RK_NODE_VALUE_MAX + 1];
    } health[RK_SUP_MAX_DEVICES];
    /* ---- the job's steps said to the agents (PROGRESS), for a fleet on the step clock:
     * cluster.c (send_progress) */
    int64_t progress_sent;
    double progress_t;
    /* ---- the partner copies (docs/recovery.md "Partner copies on another host"): partners.c
     * writes all of it; cluster.c asks it to fetch before a launch */
    struct held {
        int by;          /* the node that holds rank r's partner copies, -1 none */
        int origin;      /* ... of the rank's pins on this node */
        int64_t step[2]; /* their steps, newest first (-1 none): the holder keeps two */
        uint64_t bytes[2];
        int lag; /* said lagging (1) */
    } held[RK_SUP_MAX_DEVICES];
    relay relays[RELAYS_MAX];
    struct delivered { /* pushes relayed whole, until their receiver's SNAP_HELD (a ring) */
        int used, to;
        rk_node_snap m; /* as its SNAP_BEGIN said it */
    } delivered[RELAYS_MAX];
    int next_delivered;
    int held_unasked; /* SNAP_HELDs of pushes never relayed to their sender: ignored */
    uint32_t next_xfer;
    int last_node[RK_SUP_MAX_DEVICES]; /* rank -> the node it ran on in the last launch, -1 */
    int last_world;
    int fetch[RK_SUP_MAX_DEVICES]; /* a launch's fetch: -1 none left, -2 the holder could
                                    * not send it (or a node of it lost), -3 no step common to
                                    * the moving ranks' copies, 1 asked, 2 kept by its new node */
    int64_t fetch_step[RK_SUP_MAX_DEVICES];
    int partner_every;     /* RK_SNAP_PIN_EVERY the ranks get (0: no partner copies;
                            * RK_SUP_PARTNER_AUTO: the runtime's) */
    uint64_t snap_relayed; /* bytes of copies relayed so far */
    int partner_n;         /* copies relayed whole (push), their bytes, and their seconds from
                            * SNAP_BEGIN to SNAP_END summed */
    uint64_t partner_bytes;
    double partner_s;
    int partner_dropped; /* copies dropped: no room on the partner's link */
    /* ---- each node's snapshot memory (SNAP_MEM): facts.c records, cluster.c (snap_mem) reads */
    struct node_mem {
        int have;          /* a SNAP_MEM came */
        int64_t own, held; /* the last one's bytes */
        int64_t own_peak, held_peak;
    } mem[MAX_NODES];
    /* ---- the facts the callbacks recorded, in order: facts.c (recorded by the callbacks,
     * taken by coord_take_facts, act's first and last step); facts[fact_head..nfacts) not yet
     * taken */
    fact facts[FACTS_MAX];
    int nfacts, fact_head;
    uint8_t fact_bytes[FACT_BYTES_MAX];
    size_t fact_used;
    int lines_dropped; /* lines that found no room: their count is said */
};

/* The node running rank r of this launch (-1 none), and node k's name. */
static inline int node_of_rank(const sup_cluster *cl, int r)
{
    return r >= 0 && r < cl->n ? cl->dev_node[cl->dev[r]] : -1;
}

static inline const char *node_name(const sup_cluster *cl, int k)
{
    return k >= 0 && k < cl->o->nhosts ? cl->o->hosts[k].name : "?";
}

/* ---- facts.c: the node table's callbacks, the facts, the channels ------------------------ */

/* The node table's callbacks (rk_nodes_opts): they record, and call nothing outside. */
void coord_on_event(void *ctx, const rk_node_event *e);
int coord_on_msg(void *ctx, int k, uint8_t type, const uint8_t *payload, size_t len);
/* Act on the facts recorded, in the order they came (a line said, a channel opened, a rank's
 * bytes written into its stream, a stack dump's appended), and empty the queue. */
void coord_take_facts(sup_cluster *cl);
/* The channel (node, id) of this launch, its stream ended or not; `live`: only while open. */
chan *coord_chan_of(sup_cluster *cl, int node, uint32_t id, int live);
/* Every channel closed (a new launch, or the launch's teardown): the job closes its ends. */
void coord_close_chans(sup_cluster *cl);
/* Relay what the job wrote to remote ranks (commands) to their agents; a stream the job
 * closed ends its channel. */
void coord_relay_back(sup_cluster *cl);

/* ---- partners.c: the partner copies --------------------------------------------------- */

void coord_snap_init(sup_cluster *cl);
/* A SNAP_BEGIN, SNAP_DATA, SNAP_END or SNAP_HELD from node k (a fact taken in order). */
void coord_snap_take(sup_cluster *cl, int k, uint8_t type, const uint8_t *payload, size_t len);
/* Node k was lost: what it held is gone, the transfers through it are dropped. */
void coord_snap_node_lost(sup_cluster *cl, int k);
/* Before a launch of cl->n ranks placed by cl->dev: each rank whose node is not the one it
 * ran on gets its partner copy fetched onto its new node (SNAP_FETCH to the holder). How many
 * were asked for; the caller ticks until coord_snap_fetching is 0 or its time is up, then
 * calls coord_snap_fetched, which says and records what came and what did not. */
int coord_snap_fetch(sup_cluster *cl);
int coord_snap_fetching(const sup_cluster *cl);
void coord_snap_fetched(sup_cluster *cl);
/* The job's end: what the partner copies moved, said in one line (none: nothing). */
void coord_snap_said(sup_cluster *cl);

/* ---- agents.c: the agents' processes ------------------------------------------------------ */

/* Start every host's agent and wait until each joined, its --rsh ended, or the startup
 * timeout passed (the missing ones said, their devices left out). RK_OK (also when
 * interrupted); RK_ENOENT when --rsh cannot be run on any host; another start's error. */
int coord_start_agents(sup_cluster *cl, const rk_net_secret *key, rk_err *err);
/* Reap agents that ended, and start a new one, with backoff, for a node that has none. */
void coord_tend_agents(sup_cluster *cl);
/* After BYE: wait a little for every agent to end, then kill what is left. */
void coord_end_agents(sup_cluster *cl);

#endif
