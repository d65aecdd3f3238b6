/*
 * The device plugin's gRPC state, shared by its two halves (private to src/k8s/):
 *   server.c  the server on DIR/SOCKET and its calls: each DevicePlugin rpc parsed (msg.c),
 *             decided (policy.c) and answered; ListAndWatch streams kept and re-sent
 *   plugin.c  the Register call, the watch on both sockets, the health readings, the loop
 * Everything runs on one thread around one completion queue; a tag says what completed.
 */
#ifndef RK_K8S_PLUGIN_H
#define RK_K8S_PLUGIN_H

#include <stdbool.h>
#include <sys/types.h>
#include <sys/un.h>

#include <grpc/grpc.h>

#include "api.pb-c.h"
#include "k8s/dp.h"

typedef enum method { M_UNKNOWN, M_OPTIONS, M_WATCH, M_PREFERRED, M_ALLOCATE, M_PRESTART } method;

typedef enum tag_kind { T_NEW, T_RECV, T_SEND, T_CLOSE, T_SHUTDOWN, T_REGISTER } tag_kind;
typedef struct tag {
    tag_kind kind;
    void *p;
} tag;

typedef struct plugin plugin;

typedef struct server {
    plugin *pl;
    grpc_server *srv;
    bool stopping;
    tag t_shutdown;
} server;

/* One call on the server, from the request for it to its last completed operation. */
typedef struct call {
    struct call *prev, *next;
    plugin *pl;
    server *sv;
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array md;
    method m;
    rk_dp_kind kind;
    grpc_byte_buffer *recv_buf, *send_buf;
    grpc_slice status_details;
    bool has_status_details;
    int pending;   /* operations in flight */
    int cancelled; /* RECV_CLOSE_ON_SERVER's */
    bool closed, watching, sending, dirty, md_sent;
    tag t_new, t_recv, t_send, t_close;
} call;

typedef enum reg_state { REG_WAIT, REG_FLIGHT, REG_DONE } reg_state;

struct plugin {
    const rk_dp_opts *o;
    rk_dp_fleet *fleet;
    grpc_completion_queue *cq;
    server *cur; /* serving; NULL between a lost socket and its replacement */
    int servers; /* not yet destroyed (the current one and any shutting down) */
    call *calls; /* every live call */
    char sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char kubelet_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    dev_t sock_dev;
    ino_t sock_ino;
    double next_bind;
    int fatal; /* nonzero: stop with fatal_err (another process serves our socket) */
    rk_err fatal_err;
    bool abandoned; /* our server left running: its teardown would unlink the path */
    /* registration */
    reg_state reg;
    double next_try, backoff;
    bool said_waiting;
    bool kubelet_seen; /* the kubelet socket's identity at the last attempt */
    dev_t kubelet_dev;
    ino_t kubelet_ino;
    grpc_channel *reg_ch;
    grpc_call *reg_call;
    grpc_byte_buffer *reg_send, *reg_recv;
    grpc_metadata_array reg_md, reg_trailer;
    grpc_status_code reg_status;
    grpc_slice reg_details;
    tag t_reg;
    unsigned long registrations;
    /* health */
    double next_sample, next_watch;
    unsigned long samples;
    char last_read_err[RK_ERR_MSG_MAX];
    char last_bind_err[RK_ERR_MSG_MAX];
};

/* One line to the event callback ("[simulated] " first for a simulated fleet). */
void dp_emit(plugin *pl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A deadline ms milliseconds from now. */
gpr_timespec dp_after_ms(int64_t ms);
/* "FAILED_PRECONDITION" for a gRPC status code. */
const char *dp_code_name(int code);
/* A message packed into a new byte buffer (NULL when out of memory). */
grpc_byte_buffer *dp_pack(const ProtobufCMessage *m);

/* Serve DIR/SOCKET anew: a stale socket there (nothing answers) is replaced; one another
 * process answers on is RK_EBUSY ("served by another process"), anything else RK_EIO. */
int dp_server_start(plugin *pl, rk_err *err);
/* Does a socket answer at path? 1 it does, 0 nothing listens (ECONNREFUSED), -1 it cannot be
 * told (errno set: ENOENT when nothing is there). */
int dp_sock_probe(const char *path);
/* Stop the current server: no new calls, every call cancelled; its shutdown tag frees it. */
void dp_server_stop(plugin *pl);
/* Is DIR/SOCKET still the socket the current server made? */
bool dp_sock_is_ours(const plugin *pl);
/* Every ListAndWatch stream gets the device list again. */
void dp_broadcast(plugin *pl);
/* A call's operation completed. */
void dp_on_call_event(tag *t, bool ok);

#endif
