/*
 * relay_floor: a bare, transparent TCP relay used as a measurement tool.  It
 * does the least work a proxy can do per relayed message on this kernel (no
 * parsing, no allocation on the fast path, one thread), so its CPU time per
 * relayed message is the floor for comparing the cost per event of an epoll
 * relay against an io_uring relay.  "epoll": edge-triggered non-blocking
 * sockets, recv/send through one shared buffer.  "uring": multishot accept,
 * multishot recv into a provided buffer ring, one send in flight per
 * direction, one io_uring_enter per loop turn.
 *
 * usage: relay_floor epoll|uring LISTEN_PORT UPSTREAM_PORT
 * FLOOR_COALESCE_US=N (epoll): sleep N microseconds after each loop turn that
 * had work, so one epoll_wait returns several events (batching by waiting).
 * Prints "port N" once listening; each accepted connection is piped 1:1 to a
 * new connection to 127.0.0.1:UPSTREAM_PORT.  EOF or error on either socket
 * closes both.  SIGTERM/SIGINT exit with status 0.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_PAIRS 16384 /* pair limit, lowered to what RLIMIT_NOFILE allows */
#define EPOLL_BATCH 512
#define EPOLL_BUF (64 * 1024)
#define RING_ENTRIES 4096
#define NBUF 16384 /* provided buffers (a power of two): 64 MiB at most */
#define BUF_SIZE 4096
#define BGID 0
#define PAUSE_AT 8 /* buffers queued in one direction that pause its recv */

static int upstream_port, max_pairs;

static void die(const char *what, int err)
{
    fprintf(stderr, "relay_floor: %s: %s\n", what, strerror(err));
    exit(1);
}

/* SIGTERM/SIGINT: _exit is async-signal-safe; the kernel releases sockets and ring. */
static void on_signal(int sig)
{
    (void)sig;
    _exit(0);
}

static void set_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static struct sockaddr_in loopback(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

/* Blocking connect to the upstream; returns a blocking socket or -1. */
static int connect_upstream(void)
{
    struct sockaddr_in a = loopback(upstream_port);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(fd);
        return -1;
    }
    set_nodelay(fd);
    return fd;
}

static int listen_on(int port, int type_flags)
{
    struct sockaddr_in a = loopback(port);
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | type_flags, 0);
    if (fd < 0)
        die("socket", errno);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0)
        die("bind", errno);
    if (listen(fd, 4096) < 0)
        die("listen", errno);
    return fd;
}

/* Said once the relay can serve (its ring set up), so a mode this kernel
 * refuses is never announced. */
static void announce_port(int lfd)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    if (getsockname(lfd, (struct sockaddr *)&a, &len) < 0)
        die("getsockname", errno);
    printf("port %d\n", ntohs(a.sin_port));
    fflush(stdout);
}

/* Soft limit to hard; if the hard limit cannot hold MAX_PAIRS pairs, first try
 * to raise it as well (only succeeds with CAP_SYS_RESOURCE).  Pairs beyond
 * max_pairs are closed at once on accept, so accept never runs out of fds. */
static void raise_fd_limit(void)
{
    struct rlimit rl, want = {2 * MAX_PAIRS + 64, 2 * MAX_PAIRS + 64};
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        die("getrlimit", errno);
    if (rl.rlim_max < want.rlim_max && setrlimit(RLIMIT_NOFILE, &want) == 0) {
        rl = want;
    } else {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
            die("setrlimit", errno);
    }
    max_pairs = rl.rlim_cur < want.rlim_cur ? (int)(rl.rlim_cur - 64) / 2 : MAX_PAIRS;
}

/* ------------------------------------------------------------------ epoll */

/* One socket of a pair.  `pending` holds bytes read from this socket that its
 * peer has not taken yet; while it is non-NULL this socket is not read. */
struct econn {
    int fd;
    struct econn *peer;
    struct epair *pair;
    char *pending;
    size_t pend_off, pend_len;
};

struct epair {
    struct econn side[2];
    bool closed;
    struct epair *next_dead;
};

static int epfd, n_pairs;
static char relay_buf[EPOLL_BUF];
static struct epair *dead_pairs; /* closed during this batch, freed after it */

static void close_epair(struct epair *p)
{
    if (p->closed)
        return;
    p->closed = true;
    n_pairs--;
    for (int i = 0; i < 2; i++) {
        close(p->side[i].fd); /* also removes it from the epoll set */
        free(p->side[i].pending);
    }
    p->next_dead = dead_pairs;
    dead_pairs = p;
}

/* Relay src -> src->peer until src is drained or the peer pushes back;
 * when src's peer has closed (hup), on to the end of its stream: an
 * edge-triggered FIN that came with the last bytes raises no new event. */
static void pump(struct econn *src, bool hup)
{
    while (!src->pending) {
        ssize_t n = recv(src->fd, relay_buf, sizeof relay_buf, 0);
        if (n < 0 && errno == EAGAIN)
            return;
        if (n <= 0) {
            close_epair(src->pair);
            return;
        }
        ssize_t sent = send(src->peer->fd, relay_buf, n, MSG_NOSIGNAL);
        if (sent < 0 && errno != EAGAIN) {
            close_epair(src->pair);
            return;
        }
        if (sent < 0)
            sent = 0;
        if (sent < n) {
            src->pend_off = 0;
            src->pend_len = n - sent;
            if (!(src->pending = malloc(src->pend_len)))
                die("malloc", ENOMEM);
            memcpy(src->pending, relay_buf + sent, src->pend_len);
            return;
        }
        if (n < EPOLL_BUF && !hup)
            return;
    }
}

/* src's peer became writable: send src's backlog, then resume reading src
 * (edge-triggered, so data that arrived meanwhile raised no new event). */
static void flush_pending(struct econn *src)
{
    if (!src->pending)
        return;
    ssize_t sent = send(src->peer->fd, src->pending + src->pend_off, src->pend_len, MSG_NOSIGNAL);
    if (sent < 0 && errno != EAGAIN)
        close_epair(src->pair);
    if (sent < 0)
        return;
    src->pend_off += sent;
    src->pend_len -= sent;
    if (src->pend_len)
        return;
    free(src->pending);
    src->pending = NULL;
    pump(src, true); /* to EAGAIN: a FIN seen while paused raises no new event */
}

static void epoll_accept(int lfd)
{
    int cfd, ufd;
    while ((cfd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
        if (n_pairs >= max_pairs || (ufd = connect_upstream()) < 0) {
            close(cfd);
            continue;
        }
        fcntl(ufd, F_SETFL, fcntl(ufd, F_GETFL) | O_NONBLOCK);
        set_nodelay(cfd);
        struct epair *p = calloc(1, sizeof *p);
        if (!p)
            die("calloc", ENOMEM);
        n_pairs++;
        int fds[2] = {cfd, ufd};
        for (int i = 0; i < 2; i++) {
            struct econn *c = &p->side[i];
            *c = (struct econn){.fd = fds[i], .peer = &p->side[!i], .pair = p};
            struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
                                     .data.ptr = c};
            if (epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev) < 0)
                die("epoll_ctl", errno);
        }
    }
}

static long coalesce_us; /* FLOOR_COALESCE_US */

static void run_epoll(int lfd)
{
    struct epoll_event evs[EPOLL_BATCH], lev = {.events = EPOLLIN | EPOLLET, .data.ptr = NULL};
    if ((epfd = epoll_create1(EPOLL_CLOEXEC)) < 0)
        die("epoll_create1", errno);
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, lfd, &lev) < 0)
        die("epoll_ctl", errno);
    announce_port(lfd);
    for (;;) {
        int n = epoll_wait(epfd, evs, EPOLL_BATCH, -1);
        if (n < 0 && errno != EINTR)
            die("epoll_wait", errno);
        for (int i = 0; i < n; i++) {
            struct econn *c = evs[i].data.ptr;
            uint32_t e = evs[i].events;
            if (!c) {
                epoll_accept(lfd);
            } else if (!c->pair->closed && (e & EPOLLERR)) {
                close_epair(c->pair);
            } else if (!c->pair->closed) {
                if (e & EPOLLOUT)
                    flush_pending(c->peer); /* c's peer -> c */
                if ((e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) && !c->pair->closed)
                    pump(c, e & (EPOLLRDHUP | EPOLLHUP));
            }
        }
        for (struct epair *p; (p = dead_pairs); free(p))
            dead_pairs = p->next_dead;
        if (n > 0 && coalesce_us > 0) {
            struct timespec ts = {0, coalesce_us * 1000};
            nanosleep(&ts, NULL);
        }
    }
}

/* ------------------------------------------------------------------ uring */

/* user_data = slot << 4 | dir << 3 | op, unique among a pair's operations.  A
 * slot is reused only after every operation issued for it (recvs, sends and
 * the cancels aimed at them) has posted its final CQE, so no CQE or cancel can
 * reach a later occupant of the slot.  Cancels go by user_data: a hash lookup,
 * where IORING_ASYNC_CANCEL_FD would scan every pending poll in the ring. */
enum { OP_ACCEPT = 1, OP_RECV, OP_SEND, OP_CANCEL };

/* Data flowing from fd[d] to fd[!d]: a FIFO of received buffers linked
 * through buf_next; the head is the buffer being sent. */
struct dir {
    int head, tail; /* buffer ids, -1 when empty */
    unsigned queued;
    bool recv_armed, sending, paused;
};

struct upair {
    int fd[2];
    unsigned inflight; /* operations still to post their final CQE */
    bool closing;
    struct dir dir[2];
    int next_free;
};

static struct io_uring ring;
static struct io_uring_buf_ring *buf_ring;
static char *buf_base;
static unsigned bufs_held; /* buffers taken out of the ring, not yet given back */
static int buf_next[NBUF];
static unsigned buf_len[NBUF], buf_off[NBUF];
static struct upair pairs[MAX_PAIRS];
static int free_slot = -1, listen_fd;
/* Directions whose recv ended with -ENOBUFS, re-armed once buffers come back;
 * an index (slot * 2 + dir) is listed at most once. */
static unsigned starved[2 * MAX_PAIRS], n_starved;
static bool is_starved[2 * MAX_PAIRS];

static uint64_t udata(int slot, int d, int op)
{
    return (uint64_t)slot << 4 | (uint64_t)d << 3 | (uint64_t)op;
}

static struct io_uring_sqe *get_sqe(uint64_t user_data)
{
    struct io_uring_sqe *sqe;
    while (!(sqe = io_uring_get_sqe(&ring)))
        io_uring_submit(&ring);
    io_uring_sqe_set_data64(sqe, user_data);
    return sqe;
}

static void return_buf(int bid)
{
    io_uring_buf_ring_add(buf_ring, buf_base + (size_t)bid * BUF_SIZE, BUF_SIZE, bid,
                          io_uring_buf_ring_mask(NBUF), 0);
    io_uring_buf_ring_advance(buf_ring, 1);
    bufs_held--;
}

static void arm_accept(void)
{
    io_uring_prep_multishot_accept(get_sqe(OP_ACCEPT), listen_fd, NULL, NULL, SOCK_CLOEXEC);
}

static void arm_recv(int s, int d)
{
    struct io_uring_sqe *sqe = get_sqe(udata(s, d, OP_RECV));
    io_uring_prep_recv_multishot(sqe, pairs[s].fd[d], NULL, 0, 0);
    sqe->flags |= IOSQE_BUFFER_SELECT;
    sqe->buf_group = BGID;
    pairs[s].dir[d].recv_armed = true;
    pairs[s].inflight++;
}

static void start_send(int s, int d)
{
    int bid = pairs[s].dir[d].head;
    io_uring_prep_send(get_sqe(udata(s, d, OP_SEND)), pairs[s].fd[!d],
                       buf_base + (size_t)bid * BUF_SIZE + buf_off[bid],
                       buf_len[bid] - buf_off[bid], MSG_NOSIGNAL);
    pairs[s].dir[d].sending = true;
    pairs[s].inflight++;
}

/* Cancel one of pair s's operations; the cancel's own CQE counts as one too. */
static void cancel_op(int s, uint64_t target)
{
    io_uring_prep_cancel64(get_sqe(udata(s, 0, OP_CANCEL)), target, 0);
    pairs[s].inflight++;
}

static void finish_if_done(int s)
{
    struct upair *p = &pairs[s];
    if (!p->closing || p->inflight)
        return;
    for (int d = 0; d < 2; d++) {
        close(p->fd[d]);
        for (int bid = p->dir[d].head; bid >= 0; bid = buf_next[bid])
            return_buf(bid);
    }
    p->next_free = free_slot;
    free_slot = s;
}

static void close_pair(int s)
{
    pairs[s].closing = true;
    for (int d = 0; d < 2; d++) {
        if (pairs[s].dir[d].recv_armed)
            cancel_op(s, udata(s, d, OP_RECV));
        if (pairs[s].dir[d].sending)
            cancel_op(s, udata(s, d, OP_SEND));
    }
    finish_if_done(s);
}

static void on_accept(struct io_uring_cqe *cqe)
{
    if (!(cqe->flags & IORING_CQE_F_MORE))
        arm_accept();
    if (cqe->res < 0)
        return;
    int s = free_slot, cfd = cqe->res, ufd = s >= 0 ? connect_upstream() : -1;
    if (ufd < 0) {
        close(cfd);
        return;
    }
    set_nodelay(cfd);
    free_slot = pairs[s].next_free;
    pairs[s] = (struct upair){.fd = {cfd, ufd}};
    for (int d = 0; d < 2; d++) {
        pairs[s].dir[d].head = pairs[s].dir[d].tail = -1;
        arm_recv(s, d);
    }
}

static void enqueue(int s, int d, int bid, int len)
{
    struct dir *dr = &pairs[s].dir[d];
    buf_next[bid] = -1;
    buf_len[bid] = len;
    buf_off[bid] = 0;
    if (dr->head < 0)
        dr->head = bid;
    else
        buf_next[dr->tail] = bid;
    dr->tail = bid;
    if (++dr->queued >= PAUSE_AT && !dr->paused) {
        dr->paused = true; /* the peer is not keeping up: stop reading */
        if (dr->recv_armed)
            cancel_op(s, udata(s, d, OP_RECV));
    }
    if (!dr->sending)
        start_send(s, d);
}

static void on_recv(int s, int d, struct io_uring_cqe *cqe)
{
    struct upair *p = &pairs[s];
    struct dir *dr = &p->dir[d];
    int res = cqe->res;
    if (!(cqe->flags & IORING_CQE_F_MORE)) { /* final CQE of this recv */
        dr->recv_armed = false;
        p->inflight--;
    }
    if (cqe->flags & IORING_CQE_F_BUFFER) {
        int bid = cqe->flags >> IORING_CQE_BUFFER_SHIFT;
        bufs_held++;
        if (res > 0 && !p->closing)
            enqueue(s, d, bid, res);
        else
            return_buf(bid);
    }
    if (p->closing) {
        finish_if_done(s);
    } else if (res == 0 || (res < 0 && res != -ENOBUFS && res != -ECANCELED)) {
        close_pair(s);
    } else if (!dr->recv_armed && !dr->paused) {
        if (res != -ENOBUFS) {
            arm_recv(s, d);
        } else if (!is_starved[2 * s + d]) {
            is_starved[2 * s + d] = true;
            starved[n_starved++] = 2 * s + d;
        }
    }
}

static void on_send(int s, int d, int res)
{
    struct upair *p = &pairs[s];
    struct dir *dr = &p->dir[d];
    p->inflight--;
    dr->sending = false;
    if (p->closing) {
        finish_if_done(s);
        return;
    }
    if (res <= 0) {
        close_pair(s);
        return;
    }
    int bid = dr->head;
    if ((buf_off[bid] += res) < buf_len[bid]) {
        start_send(s, d);
        return;
    } /* short send */
    dr->head = buf_next[bid];
    dr->queued--;
    return_buf(bid);
    if (dr->head >= 0)
        start_send(s, d);
    if (dr->paused && dr->queued <= PAUSE_AT / 2) {
        dr->paused = false;
        if (!dr->recv_armed)
            arm_recv(s, d);
    }
}

/* Once the ring has buffers again, re-arm every starved recv (an idle one
 * takes no buffer; one that finds none again just gets listed again). */
static void rearm_starved(void)
{
    while (n_starved > 0 && bufs_held < NBUF) {
        unsigned id = starved[--n_starved], s = id / 2, d = id % 2;
        is_starved[id] = false;
        if (!pairs[s].closing && !pairs[s].dir[d].paused && !pairs[s].dir[d].recv_armed)
            arm_recv(s, d);
    }
}

static void setup_ring(void)
{
    static const unsigned flag_sets[] = {
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
        IORING_SETUP_COOP_TASKRUN,
        0,
    };
    int ret = -EINVAL;
    for (size_t i = 0; i < sizeof flag_sets / sizeof flag_sets[0] && ret < 0; i++) {
        struct io_uring_params params = {.flags = flag_sets[i] | IORING_SETUP_CQSIZE,
                                         .cq_entries = 8 * RING_ENTRIES};
        ret = io_uring_queue_init_params(RING_ENTRIES, &ring, &params);
    }
    if (ret < 0)
        die("io_uring_queue_init_params", -ret);

    buf_ring = mmap(NULL, NBUF * sizeof(struct io_uring_buf), PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    buf_base = mmap(NULL, (size_t)NBUF * BUF_SIZE, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf_ring == MAP_FAILED || buf_base == MAP_FAILED)
        die("mmap", errno);
    struct io_uring_buf_reg reg = {
        .ring_addr = (uintptr_t)buf_ring, .ring_entries = NBUF, .bgid = BGID};
    if ((ret = io_uring_register_buf_ring(&ring, &reg, 0)) < 0)
        die("io_uring_register_buf_ring", -ret);
    io_uring_buf_ring_init(buf_ring);
    bufs_held = NBUF;
    for (int bid = 0; bid < NBUF; bid++)
        return_buf(bid);
}

static void run_uring(int lfd)
{
    listen_fd = lfd;
    setup_ring();
    announce_port(lfd);
    for (int s = max_pairs - 1; s >= 0; s--) {
        pairs[s].next_free = free_slot;
        free_slot = s;
    }
    arm_accept();
    for (;;) {
        /* Submits everything queued during the previous turn and waits. */
        int ret = io_uring_submit_and_wait(&ring, 1);
        if (ret < 0 && ret != -EINTR && ret != -EBUSY)
            die("io_uring_submit_and_wait", -ret);
        unsigned head, seen = 0;
        struct io_uring_cqe *cqe;
        io_uring_for_each_cqe(&ring, head, cqe)
        {
            uint64_t ud = cqe->user_data;
            int s = ud >> 4, d = (ud >> 3) & 1;
            switch (ud & 7) {
            case OP_ACCEPT:
                on_accept(cqe);
                break;
            case OP_RECV:
                on_recv(s, d, cqe);
                break;
            case OP_SEND:
                on_send(s, d, cqe->res);
                break;
            case OP_CANCEL:
                pairs[s].inflight--;
                finish_if_done(s);
                break;
            }
            seen++;
        }
        io_uring_cq_advance(&ring, seen);
        rearm_starved();
    }
}

int main(int argc, char **argv)
{
    if (argc != 4 || (strcmp(argv[1], "epoll") && strcmp(argv[1], "uring"))) {
        fprintf(stderr, "usage: %s epoll|uring LISTEN_PORT UPSTREAM_PORT\n", argv[0]);
        return 2;
    }
    bool epoll_mode = strcmp(argv[1], "epoll") == 0;
    if (getenv("FLOOR_COALESCE_US"))
        coalesce_us = atol(getenv("FLOOR_COALESCE_US"));
    upstream_port = atoi(argv[3]);
    raise_fd_limit();
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    int lfd = listen_on(atoi(argv[2]), epoll_mode ? SOCK_NONBLOCK : 0);
    if (epoll_mode)
        run_epoll(lfd);
    else
        run_uring(lfd);
    return 0;
}
