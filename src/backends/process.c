/* Process backend: a model is a local command; a replica is a child process
 * on a free loopback port, given a GPU with free slices.
 *
 * Replica life: STARTING (spawned; its health URL is probed from the first
 * millisecond, fast then backing off) -> READY (reported to the fleet; takes
 * requests) -> STOPPING (SIGTERM to its process group, SIGKILL after the
 * grace) -> reaped. A replica that exits or misses its startup timeout while
 * STARTING is a failed start: held requests get 503 and restarts back off.
 *
 * Sleep mode (a model's `sleep`, for servers with vLLM's POST /sleep and
 * POST /wake_up): READY -> DOZING (out of routing, /sleep sent) -> ASLEEP
 * (the process runs, keeps its GPU slices, and its GPU memory is free in the
 * accounting) -> WAKING (memory taken back, /wake_up sent) -> READY. A
 * replica dozes after `idle_before_sleep_ms` without requests, or when a
 * start of a model of equal or higher priority needs the memory on its GPU.
 * A request held for an asleep model wakes it; when /sleep fails the replica
 * is stopped (and replaced only on demand), when /wake_up fails it is
 * stopped and a cold start follows. An asleep replica counts as one of its
 * model's replicas, so the autoscaler's idle timeout, and the warm pool's
 * evictions when slices are needed, stop it (asleep replicas go first). The
 * warm pool sees the memory awake ones hold (its nodes' `held`), so a start
 * of a higher tier preempts a busy one as it would any lower-tier replica.
 * Children run in their own process group with PR_SET_PDEATHSIG, so they
 * die with thaw even if thaw is killed; on a normal exit thaw stops and
 * reaps them itself. */
#include "thaw/backend.h"
#include "thaw/clock.h"
#include "thaw/command.h"
#include "thaw/control.h"
#include "thaw/log.h"
#include "thaw/probe.h"
#include "thaw/procplan.h"
#include "thaw/scale_driver.h"
#include "thaw/scaler.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/event_struct.h>

extern char **environ;

#define LOG_RING_LINES 20
#define LOG_LINE_MAX 240
#define TICK_MS 100


/* R_DRAINING: taken out of routing (scaled down or preempted with requests in
 * flight, its model removed, or its definition changed by a reload); stopped
 * once its in-flight requests are done or stop_drain_ms has passed. */
enum replica_state { R_STARTING, R_READY, R_DRAINING, R_STOPPING, R_DOZING, R_ASLEEP, R_WAKING };

struct proc_model;

/* What a start that cannot be placed waits for (logged when it changes). */
enum start_wait { WAIT_NONE, WAIT_SLEEP, WAIT_GPU };

struct replica {
    struct list_node node;
    struct proc_model *pm;
    enum replica_state state;
    pid_t pid;
    int port;
    int gpu; /* index into backend gpus, -1: none */
    unsigned slices; /* GPU slices it holds (its model's may change on reload) */
    uint64_t gpu_memory; /* GPU memory it needs, likewise */
    bool memory_held;    /* gpu_memory is counted on its GPU (not while asleep) */
    struct control ctl;  /* DOZING, WAKING: its /sleep or /wake_up */
    uint64_t wake_asked_ms; /* when demand first found it asleep; 0: none */
    bool sleep_for_memory;  /* DOZING: another start needs its memory */
    bool no_idle_sleep;     /* its server refused /sleep once: not asked again when idle */
    struct endpoint *drain_ep; /* R_DRAINING: its endpoint, referenced */
    uint64_t drain_until_ms;   /* R_DRAINING: stopped then even if busy */
    char id[48];
    uint64_t started_ms;
    uint64_t ready_ms; /* when it answered its health check first */
    uint64_t proxied_at_ready; /* its model's answered requests then (a crash loop
                                  is one that sees none answered) */
    bool wake_waits;   /* asleep, wanted, its GPU's memory held by a busy replica */
    struct cs_timeline phases; /* spawn -> listening (load) -> healthy (health) */
    /* output capture */
    int out_fd;
    struct event out_ev;
    char ring[LOG_RING_LINES][LOG_LINE_MAX];
    unsigned ring_next, ring_count;
    char partial[LOG_LINE_MAX];
    size_t partial_len;
    struct probe probe;
    /* stop */
    struct event kill_timer;
    bool exited;
    bool killed_at_exit; /* SIGKILLed as thaw exits, its grace over */
};

struct proc_model {
    struct list_node node;
    struct process_backend *pb;
    struct model *m;
    char **argv;
    size_t argc;
    char **env;
    size_t n_env;
    char *health_path;
    unsigned min_replicas, max_replicas, gpu_slices;
    char *mig_profile;         /* one MIG instance of this profile per replica; NULL: none */
    /* Its replicas per GPU unit for the warm pool: in, where they run; out,
     * where the plan keeps them (a stop takes one where it keeps fewer). */
    unsigned *plan_on_gpu;
    uint64_t gpu_memory_bytes; /* per replica, for placement (and MPS's memory limit) */
    uint64_t idle_timeout_ms, startup_timeout_ms, stop_grace_ms, stop_drain_ms;
    struct list_node replicas;
    unsigned n_starting, n_ready, n_draining, n_stopping;
    unsigned n_dozing, n_asleep, n_waking; /* sleep mode */
    struct config_sleep sleep;
    uint64_t busy_at_ms;    /* the last tick it had requests in flight or held */
    uint64_t last_wake_ms;  /* the last wake from sleep took this long; 0: none */
    /* A replica was stopped with nothing asking for it (for another's
     * memory, a failed /sleep, a death while asleep): no start until
     * demand (min_replicas still holds). */
    bool yielded;
    bool retired; /* its model was removed: freed once its replicas are gone */
    uint64_t idle_since_ms;
    unsigned failures;
    unsigned quick_crashes; /* replicas in a row that crashed soon after ready */
    bool sleep_timed_out; /* a /sleep went unanswered: replicas are not slept for idleness */
    uint64_t backoff_until_ms;
    bool waiting_for_capacity;
    enum start_wait wait_said; /* what its starts wait for, as last logged */
    int start_error; /* the last start's error (-errno), said once; 0: none */
    bool poked;
    char last_error[200];
    uint64_t starts, start_failures, crashes;
    uint64_t last_cold_start_ms;
    unsigned seq;
    struct scaler_model sc;
};

struct process_backend {
    struct backend base;
    struct event_base *evbase;
    struct gpu_slot *gpus;
    enum gpu_sharing *sharing;
    char **gpu_device;  /* per slot: what CUDA_VISIBLE_DEVICES names (index or MIG UUID) */
    char **gpu_profile; /* per slot: its MIG profile (gpus[i].profile points here), or NULL */
    struct wp_node *plan_nodes; /* one per GPU unit, for the warm pool (plan_nodes) */
    char (*plan_names)[40];     /* their names in decisions ("gpu1", "gpu0:1g.5gb") */
    struct wp_held *plan_held;  /* the nodes' held memory (plan_held) ... */
    size_t *plan_held_model;    /* ... and whose it is, by index in the plan */
    size_t cap_held;
    size_t n_gpus;
    struct list_node models;
    struct list_node retired; /* proc_models of removed models, draining */
    struct event *sigchld;
    struct event *tick;
    const struct config *cfg;
    struct scale_driver driver;
    bool stopping;
    bool draining; /* thaw drains to exit: no replica is started any more */
};

static struct process_backend *PB(struct backend *b)
{
    return container_of(b, struct process_backend, base);
}

/* Milliseconds from then to now; 0 when then is later (a replica started
 * after a caller took its `now`). */
static uint64_t ms_since(uint64_t now, uint64_t then)
{
    return now > then ? now - then : 0;
}

static void arm_ms(struct event *ev, uint64_t ms)
{
    struct timeval tv = clock_timeval(ms);
    event_add(ev, &tv);
}

/* ---- output capture ---------------------------------------------------- */

static void ring_push(struct replica *r, const char *line, size_t len)
{
    if (len >= LOG_LINE_MAX) {
        len = LOG_LINE_MAX - 1;
    }
    memcpy(r->ring[r->ring_next], line, len);
    r->ring[r->ring_next][len] = '\0';
    r->ring_next = (r->ring_next + 1) % LOG_RING_LINES;
    if (r->ring_count < LOG_RING_LINES) {
        r->ring_count++;
    }
    if (log_enabled(LOG_DEBUG)) {
        char q[LOG_LINE_MAX + 16];
        log_quote(q, sizeof q, line, len, LOG_LINE_MAX - 8);
        LOGD("model output", "model=%s replica=%s line=%s", r->pm->m->name, r->id, q);
    }
}

static void on_output(evutil_socket_t fd, short what, void *arg)
{
    struct replica *r = arg;
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            return;
        }
        event_del(&r->out_ev);
        close(r->out_fd);
        r->out_fd = -1;
        return;
    }
    for (ssize_t i = 0; i < n; i++) {
        char c = buf[i];
        if (c == '\n' || r->partial_len == LOG_LINE_MAX - 1) {
            ring_push(r, r->partial, r->partial_len);
            r->partial_len = 0;
            if (c == '\n') {
                continue;
            }
        }
        r->partial[r->partial_len++] = c;
    }
}

static void log_last_lines(struct replica *r)
{
    unsigned start = (r->ring_next + LOG_RING_LINES - r->ring_count) % LOG_RING_LINES;
    if (r->partial_len) {
        ring_push(r, r->partial, r->partial_len);
        r->partial_len = 0;
        start = (r->ring_next + LOG_RING_LINES - r->ring_count) % LOG_RING_LINES;
    }
    for (unsigned i = 0; i < r->ring_count; i++) {
        const char *line = r->ring[(start + i) % LOG_RING_LINES];
        char q[LOG_LINE_MAX + 16];
        log_quote(q, sizeof q, line, strlen(line), LOG_LINE_MAX - 8);
        LOGW("model log", "model=%s replica=%s line=%s", r->pm->m->name, r->id, q);
    }
}

/* A replica gone sooner than this after it became ready, having finished no
 * request, crashed in a loop (a bad weight file, an out-of-memory at the
 * first batch). */
#define CRASH_LOOP_MS 10000

/* ---- spawning ---------------------------------------------------------- */

/* A free loopback port, or -errno. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -errno;
    }
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sin;
    int port = -EADDRNOTAVAIL;
    if (bind(fd, (struct sockaddr *)&sin, sizeof sin) == 0 &&
        getsockname(fd, (struct sockaddr *)&sin, &len) == 0) {
        port = ntohs(sin.sin_port);
    } else {
        port = -errno;
    }
    close(fd);
    return port;
}

/* Replaces {port} and {gpu} in s; the result is malloc'ed. */
static char *substitute(const char *s, int port, int gpu_id)
{
    char portbuf[16], gpubuf[16];
    snprintf(portbuf, sizeof portbuf, "%d", port);
    snprintf(gpubuf, sizeof gpubuf, "%d", gpu_id < 0 ? 0 : gpu_id);
    struct buf out;
    buf_init(&out);
    while (*s) {
        if (strncmp(s, "{port}", 6) == 0) {
            buf_append_str(&out, portbuf);
            s += 6;
        } else if (strncmp(s, "{gpu}", 5) == 0) {
            buf_append_str(&out, gpubuf);
            s += 5;
        } else {
            buf_append(&out, s, 1);
            s++;
        }
    }
    buf_append(&out, "", 1);
    return out.data;
}

static void free_strv(char **v)
{
    if (!v) {
        return;
    }
    for (char **p = v; *p; p++) {
        free(*p);
    }
    free(v);
}

/* The child's environment: thaw's, then the model's, then the GPU's. */
static char **build_env(struct proc_model *pm, int port, int gpu)
{
    struct process_backend *pb = pm->pb;
    size_t n = 0;
    while (environ[n]) {
        n++;
    }
    char **env = calloc(n + pm->n_env + 4, sizeof *env);
    if (!env) {
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        /* Drop what thaw sets itself. */
        if (strncmp(environ[i], "CUDA_VISIBLE_DEVICES=", 21) == 0 ||
            strncmp(environ[i], "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=", 34) == 0 ||
            strncmp(environ[i], "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=", 33) == 0) {
            continue;
        }
        env[k++] = strdup(environ[i]);
    }
    for (size_t i = 0; i < pm->n_env; i++) {
        env[k++] = substitute(pm->env[i], port, gpu >= 0 ? pb->gpus[gpu].id : -1);
    }
    if (gpu >= 0) {
        char tmp[160];
        snprintf(tmp, sizeof tmp, "CUDA_VISIBLE_DEVICES=%s", pb->gpu_device[gpu]);
        env[k++] = strdup(tmp);
        if (pb->sharing[gpu] == GPU_MPS) {
            snprintf(tmp, sizeof tmp, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%u",
                     procplan_mps_percentage(pm->gpu_slices, pb->gpus[gpu].slices));
            env[k++] = strdup(tmp);
            if (pm->gpu_memory_bytes) {
                /* Device 0 is the one CUDA_VISIBLE_DEVICES leaves it. */
                snprintf(tmp, sizeof tmp, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=%lluM",
                         (unsigned long long)((pm->gpu_memory_bytes + (1 << 20) - 1) >> 20));
                env[k++] = strdup(tmp);
            }
        }
    }
    env[k] = NULL;
    return env;
}

static void on_probe_ready(struct probe *p, void *ud);
static void on_probe_listening(struct probe *p, void *ud);
static void on_kill_timer(evutil_socket_t fd, short what, void *arg);
static bool sleep_for_memory(struct process_backend *pb, const struct gpu_need *need,
                             const struct model *by, int only_gpu);

static unsigned gpu_slices(void *ud);

/* warm_pool.capacity_slices holds for what runs, not only for the plan:
 * replicas still draining (after a preemption) keep their slices until they
 * exit, so a start that would go over waits for them as it would for a GPU. */
static bool over_slice_cap(const struct process_backend *pb, unsigned slices)
{
    unsigned cap = scale_driver_capacity(gpu_slices((void *)pb), &pb->cfg->warm_pool);
    if (!pb->cfg->warm_pool.capacity_slices || !cap) {
        return false;
    }
    unsigned used = 0;
    for (size_t g = 0; g < pb->n_gpus; g++) {
        used += pb->gpus[g].used;
    }
    return used + slices > cap;
}

/* A start of pm cannot be placed now: said when the wait begins and when
 * what it waits for changes, not at every planning step that tries again. */
static int start_waits(struct proc_model *pm, enum start_wait w, const struct gpu_need *need)
{
    pm->waiting_for_capacity = true;
    if (pm->wait_said != w && w == WAIT_SLEEP) {
        LOGI("waiting for replicas to sleep and free GPU memory", "model=%s memory_needed=%llu",
             pm->m->name, (unsigned long long)need->memory_bytes);
    } else if (pm->wait_said != w) {
        LOGI("waiting for GPU capacity", "model=%s slices_needed=%u mig_profile=%s "
             "memory_needed=%llu", pm->m->name, need->slices,
             pm->mig_profile ? pm->mig_profile : "-", (unsigned long long)need->memory_bytes);
    }
    pm->wait_said = w;
    return -ENOSPC;
}

/* Starts one replica. 0, -ENOSPC (no GPU slices free) or another error. */
static int replica_start(struct proc_model *pm)
{
    struct process_backend *pb = pm->pb;
    if (pb->draining) {
        return -ESHUTDOWN; /* a model server's load outlasts the drain */
    }
    int gpu = -1;
    if (pm->gpu_slices > 0 || pm->mig_profile) {
        struct gpu_need need = {pm->mig_profile ? 1 : pm->gpu_slices, pm->gpu_memory_bytes,
                                pm->mig_profile};
        bool capped = over_slice_cap(pb, need.slices);
        gpu = capped ? -1 : procplan_gpu_place(pb->gpus, pb->n_gpus, &need);
        if (gpu < 0) {
            bool sleeps = !capped && sleep_for_memory(pb, &need, pm->m, -1);
            return start_waits(pm, sleeps ? WAIT_SLEEP : WAIT_GPU, &need);
        }
    }
    pm->waiting_for_capacity = false;
    pm->wait_said = WAIT_NONE;
    int port = free_port();
    if (port < 0) {
        return port;
    }
    int gpu_id = gpu >= 0 ? pb->gpus[gpu].id : -1;
    char **argv = calloc(pm->argc + 1, sizeof *argv);
    char **env = build_env(pm, port, gpu);
    int pipefd[2] = {-1, -1};
    if (!argv || !env || pipe2(pipefd, O_CLOEXEC) < 0) {
        int err = argv && env ? errno : ENOMEM;
        free(argv);
        free_strv(env);
        return -err;
    }
    for (size_t i = 0; i < pm->argc; i++) {
        argv[i] = substitute(pm->argv[i], port, gpu_id);
    }
    pid_t parent = getpid();
    /* Until the child has put every signal back to its default, thaw's own
     * handlers would run there: they write to thaw's signal pipe, so a
     * SIGTERM meant for a child stopped before its exec (started and
     * stopped in one turn) would reach thaw as its own. Signals stay
     * blocked across the fork and in the child until then. */
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &old);
    pid_t pid = fork();
    if (pid == 0) {
        /* Child: own process group, dies with thaw, output to the pipe. */
        for (int sig = 1; sig < NSIG; sig++) {
            signal(sig, SIG_DFL); /* SIGKILL, SIGSTOP and libc's own refuse: none is caught */
        }
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) {
            _exit(127);
        }
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) {
            dup2(devnull, STDIN_FILENO);
        }
        dup2(pipefd[1], STDOUT_FILENO);
        dup2(pipefd[1], STDERR_FILENO);
        execve(argv[0], argv, env);
        if (!strchr(argv[0], '/')) {
            execvpe(argv[0], argv, env);
        }
        dprintf(STDERR_FILENO, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int err = errno;
    sigprocmask(SIG_SETMASK, &old, NULL);
    close(pipefd[1]);
    free_strv(env);
    for (size_t i = 0; i < pm->argc; i++) {
        free(argv[i]);
    }
    free(argv);
    if (pid < 0) {
        close(pipefd[0]);
        return -err;
    }
    setpgid(pid, pid); /* also from here: no window where a signal misses the group */
    struct replica *r = calloc(1, sizeof *r);
    if (!r) {
        kill(-pid, SIGKILL);
        close(pipefd[0]);
        return -ENOMEM;
    }
    r->pm = pm;
    r->state = R_STARTING;
    r->pid = pid;
    r->port = port;
    r->gpu = gpu;
    r->started_ms = clock_now_ms();
    snprintf(r->id, sizeof r->id, "%s-%u", pm->m->name, ++pm->seq);
    r->out_fd = pipefd[0];
    fcntl(r->out_fd, F_SETFL, O_NONBLOCK);
    event_assign(&r->out_ev, pb->evbase, r->out_fd, EV_READ | EV_PERSIST, on_output, r);
    event_add(&r->out_ev, NULL);
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    probe_init(&r->probe, pb->evbase, addr, pm->health_path, on_probe_ready, r);
    r->probe.listening = on_probe_listening;
    r->probe.replica = r->id;
    cs_timeline_begin(&r->phases, CS_LOAD, r->started_ms);
    if (pm->m->n_endpoints == 0) {
        /* Clients wait for this one (or a sibling starting with it). */
        coldstart_begin(&pm->m->cold, CS_LOAD, r->started_ms);
    }
    event_assign(&r->kill_timer, pb->evbase, -1, 0, on_kill_timer, r);
    control_init(&r->ctl, pb->evbase);
    /* The last cold start says when to probe tightly. */
    probe_start(&r->probe, pm->last_cold_start_ms);
    if (gpu >= 0) {
        r->slices = pm->mig_profile ? 1 : pm->gpu_slices;
        r->gpu_memory = pm->gpu_memory_bytes;
        pb->gpus[gpu].used += r->slices;
        pb->gpus[gpu].memory_used += r->gpu_memory;
        r->memory_held = true;
    }
    list_push_back(&pm->replicas, &r->node);
    pm->n_starting++;
    pm->starts++;
    LOGI("starting replica", "model=%s replica=%s pid=%d port=%d gpu=%d", pm->m->name, r->id,
         (int)pid, port, gpu_id);
    return 0;
}

static void release_drain_ep(struct replica *r)
{
    if (r->drain_ep) {
        endpoint_unref(r->drain_ep);
        r->drain_ep = NULL;
    }
}

/* Leaves DOZING, ASLEEP or WAKING (its control request dropped). */
static void sleep_state_leave(struct replica *r)
{
    struct proc_model *pm = r->pm;
    control_cancel(&r->ctl);
    if (r->state == R_DOZING) {
        pm->n_dozing--;
    } else if (r->state == R_ASLEEP) {
        pm->n_asleep--;
    } else if (r->state == R_WAKING) {
        pm->n_waking--;
    }
}

static void replica_stop(struct replica *r, const char *why)
{
    struct proc_model *pm = r->pm;
    if (r->state == R_STOPPING) {
        return;
    }
    if (r->state == R_READY) {
        pm->n_ready--;
        fleet_replica_gone(pm->m->fleet, pm->m, r->id, why);
    } else if (r->state == R_DRAINING) {
        pm->n_draining--;
        release_drain_ep(r);
    } else if (r->state == R_STARTING) {
        pm->n_starting--;
    } else {
        sleep_state_leave(r);
    }
    r->state = R_STOPPING;
    pm->n_stopping++;
    probe_stop(&r->probe);
    LOGI("stopping replica", "model=%s replica=%s pid=%d reason=\"%s\"", pm->m->name, r->id,
         (int)r->pid, why);
    kill(-r->pid, SIGTERM);
    arm_ms(&r->kill_timer, pm->stop_grace_ms);
}

static void on_kill_timer(evutil_socket_t fd, short what, void *arg)
{
    struct replica *r = arg;
    if (!r->exited) {
        LOGW("replica did not stop in time: SIGKILL", "model=%s replica=%s pid=%d",
             r->pm->m->name, r->id, (int)r->pid);
        kill(-r->pid, SIGKILL);
    }
}

static void replica_free(struct replica *r)
{
    struct process_backend *pb = r->pm->pb;
    release_drain_ep(r);
    probe_stop(&r->probe);
    control_cancel(&r->ctl);
    event_del(&r->kill_timer);
    if (r->out_fd >= 0) {
        /* Take what the child wrote last before it went (not at shutdown:
         * the models it would be logged under may be gone). */
        if (!pb->stopping) {
            on_output(r->out_fd, EV_READ, r);
        }
        if (r->out_fd >= 0) {
            event_del(&r->out_ev);
            close(r->out_fd);
        }
    }
    if (r->gpu >= 0) {
        pb->gpus[r->gpu].used -= r->slices;
        if (r->memory_held) {
            pb->gpus[r->gpu].memory_used -= r->gpu_memory;
        }
    }
    list_remove(&r->node);
    free(r);
}

/* ---- readiness --------------------------------------------------------- */

static void became_ready(struct replica *r, int conn_fd)
{
    struct proc_model *pm = r->pm;
    uint64_t now = clock_now_ms();
    r->state = R_READY;
    r->ready_ms = now;
    r->proxied_at_ready = pm->m->stats.proxied;
    pm->n_starting--;
    pm->n_ready++;
    pm->failures = 0;
    pm->backoff_until_ms = 0;
    pm->last_cold_start_ms = ms_since(now, r->started_ms);
    pm->m->cold_start_ms = pm->last_cold_start_ms;
    pm->busy_at_ms = now; /* idle_before_sleep_ms counts from here */
    histogram_observe_in(&pm->m->stats.cold_start, cs_hist_bounds,
                         (double)pm->last_cold_start_ms / 1000.0);
    coldstart_replica_ready(&pm->m->cold, &r->phases, now, pm->m->stats.cold_phase);
    LOGI("replica ready after cold start", "model=%s replica=%s cold_start_ms=%llu load_ms=%llu "
         "health_ms=%llu", pm->m->name, r->id, (unsigned long long)pm->last_cold_start_ms,
         (unsigned long long)cs_timeline_phase_ms(&r->phases, CS_LOAD, now),
         (unsigned long long)cs_timeline_phase_ms(&r->phases, CS_HEALTH, now));
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", r->port);
    fleet_replica_ready_with(pm->m->fleet, pm->m, r->id, addr, UINT32_MAX, conn_fd);
}

/* The server bound its port: loading is over, its health check is next. */
static void on_probe_listening(struct probe *p, void *ud)
{
    struct replica *r = ud;
    if (r->state != R_STARTING) {
        return;
    }
    cs_timeline_enter(&r->phases, CS_HEALTH, p->listening_ms);
    struct coldstart *c = &r->pm->m->cold;
    if (c->started_ms && c->phase < CS_HEALTH) {
        coldstart_phase(c, CS_HEALTH, p->listening_ms);
    }
}

static void on_probe_ready(struct probe *p, void *ud)
{
    struct replica *r = ud;
    if (r->state == R_STARTING) {
        /* The probe's connection carries the first request. */
        became_ready(r, probe_take_conn(p));
    }
}

/* ---- reconciling ------------------------------------------------------- */

static void start_failed(struct proc_model *pm, struct replica *r, const char *why)
{
    uint64_t now = clock_now_ms();
    pm->failures++;
    pm->start_failures++;
    uint64_t backoff = procplan_restart_backoff_ms(pm->failures);
    pm->backoff_until_ms = now + backoff;
    snprintf(pm->last_error, sizeof pm->last_error, "%s", why);
    LOGW("replica failed to start", "model=%s replica=%s reason=\"%s\" retry_in_ms=%llu",
         pm->m->name, r->id, why, (unsigned long long)backoff);
    log_last_lines(r);
    if (pm->n_ready == 0 && pm->n_starting == 0) {
        fleet_model_unavailable(pm->m->fleet, pm->m, why, backoff);
    }
}

/* In-flight requests at the replica (its endpoint, once ready). */
static uint32_t replica_inflight(struct replica *r)
{
    struct model *m = r->pm->m;
    for (size_t i = 0; i < m->n_endpoints; i++) {
        if (strcmp(m->endpoints[i]->id, r->id) == 0) {
            return m->endpoints[i]->inflight;
        }
    }
    return 0;
}

static struct endpoint *replica_endpoint(struct replica *r)
{
    struct model *m = r->pm->m;
    for (size_t i = 0; i < m->n_endpoints; i++) {
        if (strcmp(m->endpoints[i]->id, r->id) == 0) {
            return m->endpoints[i];
        }
    }
    return NULL;
}

/* Takes a replica out of routing at once and stops it when the requests it
 * is serving are done, or stop_drain_ms has passed (a starting one stops
 * now), so a scale-down, a preemption or a reload does not cut streams. */
static void replica_drain(struct replica *r, const char *why)
{
    struct proc_model *pm = r->pm;
    if (r->state == R_DRAINING || r->state == R_STOPPING) {
        return; /* on its way out already (a second reload): its drain stands */
    }
    if (r->state != R_READY) {
        replica_stop(r, why);
        return;
    }
    struct endpoint *ep = replica_endpoint(r);
    if (!ep || ep->inflight == 0 || pm->stop_drain_ms == 0) {
        replica_stop(r, why);
        return;
    }
    endpoint_ref(ep);
    r->drain_ep = ep;
    r->drain_until_ms = clock_now_ms() + pm->stop_drain_ms;
    pm->n_ready--;
    fleet_replica_gone(pm->m->fleet, pm->m, r->id, why);
    r->state = R_DRAINING;
    pm->n_draining++;
    LOGI("draining replica", "model=%s replica=%s inflight=%u reason=\"%s\"", pm->m->name, r->id,
         ep->inflight, why);
}

/* Draining replicas whose last request finished, or whose stop_drain_ms
 * has passed, are stopped. */
static void stop_drained(struct proc_model *pm)
{
    uint64_t now = clock_now_ms();
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &pm->replicas)
    {
        struct replica *r = container_of(pos, struct replica, node);
        if (r->state != R_DRAINING) {
            continue;
        }
        if (r->drain_ep->inflight == 0) {
            replica_stop(r, "drained");
        } else if (now >= r->drain_until_ms) {
            replica_stop(r, "stop_drain_ms passed with requests in flight");
        }
    }
}

/* Starts or stops replicas until the model has `target`. Stopping takes
 * starting replicas first, then ready ones with the fewest in flight. */
static bool held_state(enum replica_state s)
{
    return s != R_DRAINING && s != R_STOPPING;
}

/* Per GPU unit, how many more of pm's replicas run there than the last
 * plan keeps (NULL when the plan was not by GPU, or none is over). */
static unsigned *over_plan(const struct proc_model *pm)
{
    size_t n = pm->pb->n_gpus;
    unsigned *over = pm->plan_on_gpu && n ? calloc(n, sizeof *over) : NULL;
    if (!over) {
        return NULL;
    }
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &pm->replicas)
    {
        const struct replica *r = container_of(pos, struct replica, node);
        if (r->gpu >= 0 && held_state(r->state)) {
            over[r->gpu]++;
        }
    }
    bool any = false;
    for (size_t g = 0; g < n; g++) {
        over[g] = over[g] > pm->plan_on_gpu[g] ? over[g] - pm->plan_on_gpu[g] : 0;
        any = any || over[g];
    }
    if (!any) {
        free(over);
        return NULL;
    }
    return over;
}

static unsigned replicas_held(const struct proc_model *pm)
{
    return pm->n_ready + pm->n_starting + pm->n_dozing + pm->n_asleep + pm->n_waking;
}

/* How much a replica is worth keeping when one must stop: asleep or dozing
 * ones serve nothing and go first, then those still starting, then the
 * ready one with the fewest requests in flight. */
static uint32_t keep_rank(struct replica *r)
{
    if (r->state == R_ASLEEP || r->state == R_DOZING) {
        return 0;
    }
    if (r->state == R_STARTING || r->state == R_WAKING) {
        return 1;
    }
    return 2 + replica_inflight(r);
}

static void apply_target(struct proc_model *pm, unsigned target, const char *why)
{
    unsigned have = replicas_held(pm);
    while (have < target) {
        int rc = replica_start(pm);
        bool waits = rc == -ENOSPC || rc == -ESHUTDOWN; /* said where it is decided */
        if (rc && !waits && rc != pm->start_error) {
            /* Out of descriptors, ports or processes: retried each step,
             * said once (held requests wait on, to their queue timeout). */
            LOGW("cannot start a replica", "model=%s error=\"%s\"", pm->m->name,
                 strerror(-rc));
        }
        pm->start_error = waits ? 0 : rc;
        if (rc) {
            break;
        }
        have++;
    }
    /* An eviction or a preemption frees room on one GPU: its stops take
     * replicas where the plan keeps fewer than run, before any other. An
     * ordinary scale-down takes the least useful replica wherever it is. */
    unsigned *over = have > target && pm->sc.released_on_node ? over_plan(pm) : NULL;
    while (have > target) {
        struct replica *victim = NULL;
        bool victim_over = false;
        uint32_t best = UINT32_MAX;
        struct list_node *pos, *tmp;
        list_for_each_safe(pos, tmp, &pm->replicas)
        {
            struct replica *r = container_of(pos, struct replica, node);
            if (!held_state(r->state)) {
                continue;
            }
            bool r_over = over && r->gpu >= 0 && over[r->gpu] > 0;
            uint32_t rank = keep_rank(r);
            /* Of replicas starting, the newest goes (the others are nearer ready). */
            bool better = rank < best || (rank == best && rank == 1);
            if ((r_over && !victim_over) || (r_over == victim_over && better)) {
                victim = r;
                victim_over = r_over;
                best = rank;
            }
        }
        if (!victim) {
            break;
        }
        if (victim_over) {
            over[victim->gpu]--;
        }
        replica_drain(victim, why);
        have--;
    }
    free(over);
}

/* ---- sleep mode --------------------------------------------------------- */

static void plan_all(struct process_backend *pb);

static void replica_addr(const struct replica *r, char *out, size_t len)
{
    snprintf(out, len, "127.0.0.1:%d", r->port);
}

static bool model_idle(const struct proc_model *pm)
{
    return pm->m->inflight == 0 && pm->m->queue.count == 0;
}

static void take_memory(struct replica *r, bool take)
{
    if (r->gpu < 0 || r->memory_held == take) {
        return;
    }
    struct gpu_slot *g = &r->pm->pb->gpus[r->gpu];
    if (take) {
        g->memory_used += r->gpu_memory;
    } else {
        g->memory_used -= r->gpu_memory;
    }
    r->memory_held = take;
}

static void wake_wanted(struct proc_model *pm);

/* A /sleep that failed: when the server answered (an error status) and the
 * sleep was only for idleness, the replica is still serving and goes back
 * into routing. When it did not answer (timeout, reset), or the memory is
 * needed, it is stopped. */
static bool refused_but_serving(const struct replica *r, int status)
{
    return status > 0 && !r->sleep_for_memory;
}

static void on_slept(struct control *c, int status, void *ud)
{
    struct replica *r = ud;
    struct proc_model *pm = r->pm;
    pm->n_dozing--;
    if ((status < 200 || status > 299) && refused_but_serving(r, status)) {
        pm->m->stats.sleep_failures++;
        LOGW("replica refused to sleep: it stays awake", "model=%s replica=%s status=%d",
             pm->m->name, r->id, status);
        r->no_idle_sleep = true;
        r->state = R_READY;
        pm->n_ready++;
        char addr[32];
        replica_addr(r, addr, sizeof addr);
        fleet_replica_ready_with(pm->m->fleet, pm->m, r->id, addr, UINT32_MAX, -1);
    } else if (status < 200 || status > 299) {
        pm->m->stats.sleep_failures++;
        LOGW("replica did not go to sleep: stopping it instead", "model=%s replica=%s "
             "status=%d", pm->m->name, r->id, status);
        /* Idle, a replacement would start at once, with nothing asking for
         * it, only to be put to sleep (and fail) again, or to take back the
         * memory it gave up: the next start waits for demand. One that
         * min_replicas starts is not slept for idleness (it would time out
         * and be replaced, a cold start per cycle). */
        pm->yielded = true;
        pm->sleep_timed_out = true;
        r->state = R_ASLEEP; /* replica_stop leaves it from here */
        pm->n_asleep++;
        replica_stop(r, "sleep failed");
    } else {
        r->state = R_ASLEEP;
        pm->n_asleep++;
        take_memory(r, false);
        pm->m->stats.sleeps++;
        LOGI("replica asleep", "model=%s replica=%s gpu_memory_freed=%llu", pm->m->name, r->id,
             (unsigned long long)(r->gpu >= 0 ? r->gpu_memory : 0));
        wake_wanted(pm); /* a request may have come meanwhile */
    }
    plan_all(pm->pb); /* the memory (or the slices) may let a start go */
}

/* Takes a ready replica with nothing in flight out of routing and asks it to
 * sleep. 0, or a negative errno (it stays ready). */
static int replica_sleep(struct replica *r, const char *why)
{
    struct proc_model *pm = r->pm;
    char addr[32], path[32];
    replica_addr(r, addr, sizeof addr);
    snprintf(path, sizeof path, "/sleep?level=%u", (unsigned)pm->sleep.level);
    int rc = control_send(&r->ctl, addr, "POST", path, pm->sleep.timeout_ms,
                          on_slept, r);
    if (rc) {
        return rc;
    }
    pm->n_ready--;
    fleet_replica_gone(pm->m->fleet, pm->m, r->id, why);
    r->state = R_DOZING;
    pm->n_dozing++;
    LOGI("putting replica to sleep", "model=%s replica=%s level=%u reason=\"%s\"", pm->m->name,
         r->id, (unsigned)pm->sleep.level, why);
    return 0;
}

static void on_woken(struct control *c, int status, void *ud)
{
    struct replica *r = ud;
    struct proc_model *pm = r->pm;
    uint64_t now = clock_now_ms();
    pm->n_waking--;
    if (status < 200 || status > 299) {
        pm->m->stats.wake_failures++;
        LOGW("replica did not wake: stopping it for a cold start", "model=%s replica=%s "
             "status=%d", pm->m->name, r->id, status);
        r->state = R_ASLEEP;
        pm->n_asleep++;
        replica_stop(r, "wake failed");
        plan_all(pm->pb); /* held requests still count as demand: a new replica starts */
        return;
    }
    r->state = R_READY;
    pm->n_ready++;
    pm->m->stats.wakes++;
    pm->last_wake_ms = ms_since(now, r->wake_asked_ms);
    histogram_observe(&pm->m->stats.wake, (double)pm->last_wake_ms / 1000.0);
    LOGI("replica awake", "model=%s replica=%s wake_ms=%llu", pm->m->name, r->id,
         (unsigned long long)pm->last_wake_ms);
    r->wake_asked_ms = 0;
    pm->busy_at_ms = now;
    char addr[32];
    replica_addr(r, addr, sizeof addr);
    fleet_replica_ready_with(pm->m->fleet, pm->m, r->id, addr, UINT32_MAX, -1);
}

/* Does the replica's memory fit back on its GPU? */
static bool memory_fits_back(const struct replica *r)
{
    if (r->gpu < 0) {
        return true;
    }
    const struct gpu_slot *g = &r->pm->pb->gpus[r->gpu];
    return !g->memory_bytes || g->memory_used + r->gpu_memory <= g->memory_bytes;
}

/* Wakes an asleep replica: takes its memory back and sends /wake_up. When
 * its GPU's memory is taken meanwhile, idle replicas there are put to sleep
 * for it (it waits); with none idle now, it is stopped for a cold start only
 * where another GPU has room for one, else it waits for the replica that
 * holds the memory to sleep or stop (a wake is seconds, a cold start
 * minutes). */
static void replica_wake(struct replica *r)
{
    struct proc_model *pm = r->pm;
    struct process_backend *pb = pm->pb;
    if (!r->wake_asked_ms) {
        r->wake_asked_ms = clock_now_ms();
    }
    if (!memory_fits_back(r)) {
        struct gpu_need need = {0, r->gpu_memory, NULL};
        if (sleep_for_memory(pb, &need, pm->m, r->gpu)) {
            return; /* woken when that memory is free (the tick asks again) */
        }
        struct gpu_need cold = {pm->mig_profile ? 1 : pm->gpu_slices, pm->gpu_memory_bytes,
                                pm->mig_profile};
        int elsewhere = procplan_gpu_place(pb->gpus, pb->n_gpus, &cold);
        if (elsewhere < 0 || elsewhere == r->gpu) {
            if (!r->wake_waits) {
                r->wake_waits = true;
                LOGI("waiting for GPU memory to wake into", "model=%s replica=%s gpu=%d",
                     pm->m->name, r->id, r->gpu);
            }
            return; /* the tick asks again */
        }
        LOGW("no GPU memory to wake into: stopping the replica for a cold start",
             "model=%s replica=%s on_gpu=%d", pm->m->name, r->id, elsewhere);
        pm->m->stats.wake_failures++;
        replica_stop(r, "no GPU memory to wake into");
        plan_all(pb);
        return;
    }
    char addr[32];
    replica_addr(r, addr, sizeof addr);
    int rc = control_send(&r->ctl, addr, "POST", "/wake_up", pm->sleep.timeout_ms,
                          on_woken, r);
    if (rc) {
        pm->m->stats.wake_failures++;
        LOGW("cannot send /wake_up: stopping the replica for a cold start", "model=%s "
             "replica=%s error=\"%s\"", pm->m->name, r->id, strerror(-rc));
        replica_stop(r, "wake failed");
        plan_all(pb);
        return;
    }
    take_memory(r, true);
    r->wake_waits = false;
    pm->n_asleep--;
    r->state = R_WAKING;
    pm->n_waking++;
    LOGI("waking replica", "model=%s replica=%s", pm->m->name, r->id);
}

/* With requests in flight or held, the model wants the autoscaler's count
 * awake (at least one while requests wait); asleep replicas make up the
 * difference before anything starts. An idle model wakes nothing. */
static void wake_wanted(struct proc_model *pm)
{
    if (model_idle(pm) || pm->n_asleep == 0) {
        return;
    }
    unsigned want = pm->sc.last.desired;
    if (want < 1) {
        want = 1;
    }
    unsigned awake = pm->n_ready + pm->n_starting + pm->n_waking;
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &pm->replicas)
    {
        struct replica *r = container_of(pos, struct replica, node);
        if (awake >= want) {
            break;
        }
        if (r->state == R_ASLEEP) {
            replica_wake(r);
            awake++;
        }
    }
}

/* Could r be put to sleep now: a ready replica, holding its memory, of an
 * idle sleep-capable model? */
static bool sleepable_now(const struct replica *r)
{
    return r->state == R_READY && r->pm->sleep.enabled && model_idle(r->pm) && r->memory_held;
}

/* May r's memory be freed by sleeping it for a replica of model `by`? An
 * idle ready replica of a sleep-capable model of equal or lower priority
 * (waking it again takes seconds, so equal priority may yield too). */
static bool may_sleep_for(const struct replica *r, const struct model *by)
{
    const struct proc_model *pm = r->pm;
    return sleepable_now(r) && pm->m != by && pm->m->set.priority >= by->set.priority;
}

/* A start (or a wake) of `by` needs need->memory_bytes on one GPU with
 * need->slices free (on only_gpu when >= 0). Finds the GPU where sleeping idle replicas (lowest
 * priority first) frees enough, counting those already dozing there, and
 * puts them to sleep. True when memory is on its way. */
static bool sleep_for_memory(struct process_backend *pb, const struct gpu_need *need,
                             const struct model *by, int only_gpu)
{
    if (!need->memory_bytes || need->profile) {
        return false;
    }
    for (size_t g = 0; g < pb->n_gpus; g++) {
        struct gpu_slot *slot = &pb->gpus[g];
        if ((only_gpu >= 0 && (int)g != only_gpu) || slot->profile || !slot->memory_bytes ||
            slot->slices - slot->used < need->slices) {
            continue;
        }
        uint64_t free_now = slot->memory_used < slot->memory_bytes
                                ? slot->memory_bytes - slot->memory_used : 0;
        uint64_t coming = 0, can = 0;
        struct list_node *mp, *mt;
        list_for_each_safe(mp, mt, &pb->models)
        {
            struct proc_model *pm = container_of(mp, struct proc_model, node);
            struct list_node *rp, *rt;
            list_for_each_safe(rp, rt, &pm->replicas)
            {
                struct replica *r = container_of(rp, struct replica, node);
                if (r->gpu != (int)g) {
                    continue;
                }
                if (r->state == R_DOZING && r->memory_held) {
                    coming += r->gpu_memory;
                } else if (may_sleep_for(r, by)) {
                    can += r->gpu_memory;
                }
            }
        }
        if (free_now + coming >= need->memory_bytes && coming) {
            return true; /* enough is on its way already */
        }
        if (free_now + coming + can < need->memory_bytes) {
            continue;
        }
        /* Lowest priority first, until enough is coming. */
        for (int t = TIER_COUNT - 1; t >= 0 && free_now + coming < need->memory_bytes; t--) {
            list_for_each_safe(mp, mt, &pb->models)
            {
                struct proc_model *pm = container_of(mp, struct proc_model, node);
                if ((int)pm->m->set.priority != t) {
                    continue;
                }
                struct list_node *rp, *rt;
                list_for_each_safe(rp, rt, &pm->replicas)
                {
                    struct replica *r = container_of(rp, struct replica, node);
                    if (free_now + coming >= need->memory_bytes) {
                        break;
                    }
                    if (r->gpu == (int)g && may_sleep_for(r, by)) {
                        char why[96];
                        snprintf(why, sizeof why, "GPU memory needed by %s", by->name);
                        r->sleep_for_memory = true;
                        if (replica_sleep(r, why) == 0) {
                            coming += r->gpu_memory;
                        }
                    }
                }
            }
        }
        return coming > 0 && free_now + coming >= need->memory_bytes;
    }
    return false;
}

/* Nothing is held for the model any more (its requests timed out or their
 * clients left): a wake that waited for memory is not wanted now, and the
 * plan no longer makes room for it. */
static void forget_wakes(struct proc_model *pm)
{
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &pm->replicas)
    {
        struct replica *r = container_of(pos, struct replica, node);
        if (r->state == R_ASLEEP && r->wake_asked_ms) {
            r->wake_waits = false;
            r->wake_asked_ms = 0;
        }
    }
}

/* The tick's part: idle sleep-capable replicas doze after
 * idle_before_sleep_ms without requests; asleep ones wake for demand. */
static void sleep_tick(struct proc_model *pm, uint64_t now)
{
    pm->m->replicas_asleep = pm->n_asleep + pm->n_dozing;
    if (!model_idle(pm)) {
        pm->busy_at_ms = now;
        pm->yielded = false;
        wake_wanted(pm);
        return;
    }
    forget_wakes(pm);
    if (!pm->sleep.enabled || !pm->sleep.idle_before_sleep_ms || pm->n_ready == 0 ||
        ms_since(now, pm->busy_at_ms) < pm->sleep.idle_before_sleep_ms) {
        return;
    }
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &pm->replicas)
    {
        struct replica *r = container_of(pos, struct replica, node);
        if (r->state == R_READY && !r->no_idle_sleep && !pm->sleep_timed_out) {
            r->sleep_for_memory = false;
            replica_sleep(r, "idle_before_sleep_ms passed");
        }
    }
}

/* ---- scaling driver hooks ---- */

static size_t count_models(void *ud)
{
    struct process_backend *pb = ud;
    size_t n = 0;
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &pb->models)
    {
        n++;
    }
    return n;
}

static size_t collect_models(void *ud, uint64_t now_ms, struct scaler_model **sms, size_t max)
{
    struct process_backend *pb = ud;
    size_t n = 0;
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &pb->models)
    {
        struct proc_model *pm = container_of(pos, struct proc_model, node);
        if (n == max) {
            break;
        }
        pm->sc.current = replicas_held(pm);
        /* Asleep replicas are ones the autoscaler keeps (the idle timeout,
         * not the stable window, stops them): they serve after a wake. */
        pm->sc.ready = pm->n_ready + pm->n_dozing + pm->n_asleep + pm->n_waking;
        pm->sc.hold_starts = now_ms < pm->backoff_until_ms;
        pm->sc.demand_starts = pm->yielded && model_idle(pm);
        sms[n++] = &pm->sc;
    }
    return n;
}

static unsigned gpu_slices(void *ud)
{
    struct process_backend *pb = ud;
    unsigned total = 0;
    for (size_t i = 0; i < pb->n_gpus; i++) {
        total += pb->gpus[i].slices;
    }
    return total;
}

static struct proc_model *proc_model_of(struct scaler_model *sm)
{
    return container_of(sm, struct proc_model, sc);
}

/* Why a model's replicas start or stop: an eviction's or preemption's
 * reason, else the plan's last decision for it but a plain admit. */
static const char *target_reason(const struct scaler_model *sc)
{
    if (sc->released_on_node) {
        return sc->release_reason;
    }
    return sc->last_reason[0] && strcmp(sc->last_action, "admit") ? sc->last_reason
                                                                  : "autoscaler";
}

/* Stops first, so the slices they free are there for the starts. */
static void apply_targets(void *ud, struct scaler_model **sms, size_t n, uint64_t now_ms)
{
    for (size_t i = 0; i < n; i++) {
        struct proc_model *pm = proc_model_of(sms[i]);
        bool denied = pm->sc.target < pm->sc.last.desired && !pm->sc.hold_starts &&
                      !pm->sc.demand_starts;
        pm->waiting_for_capacity = denied && (pm->m->queue.count > 0 || pm->poked);
        pm->poked = false;
        if (pm->sc.last.desired <= replicas_held(pm)) {
            pm->wait_said = WAIT_NONE; /* nothing more wanted: a later wait is news */
        }
    }
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < n; i++) {
            struct proc_model *pm = proc_model_of(sms[i]);
            unsigned have = replicas_held(pm);
            unsigned target = pm->sc.target;
            if ((pass == 0 && target < have) || (pass == 1 && target > have)) {
                apply_target(pm, target, target_reason(&pm->sc));
            }
        }
    }
}

/* GPU memory a replica of pm takes that the plan counts: its declaration on
 * a whole GPU; none for MIG (the profile is the memory). A sleep-mode
 * model's counts too (a newcomer of it needs the memory as any other
 * does), though not per model: what its awake replicas hold is listed per
 * GPU (plan_held), as free for a start that may have them put to sleep
 * (sleep_for_memory), and held, and preempted, for any other. */
static uint64_t planned_memory(const struct proc_model *pm)
{
    return pm->mig_profile ? 0 : pm->gpu_memory_bytes;
}

/* Does r hold memory the plan lists as its GPU's `held`: an awake replica
 * of a sleep-mode model (a dozing one's is on its way)? */
static bool plan_holds(const struct replica *r)
{
    return r->pm->sleep.enabled && r->gpu >= 0 && r->memory_held && r->gpu_memory &&
           held_state(r->state) && r->state != R_DOZING;
}

/* Each GPU unit's held memory, with the index in sms of the model holding
 * it. Out of memory, none is listed (the plan admits as if none were
 * awake; a start that does not fit still waits in replica_start). */
static void plan_held(struct process_backend *pb, struct scaler_model **sms, size_t n)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        struct proc_model *pm = container_of(sms[i], struct proc_model, sc);
        struct list_node *pos, *tmp;
        list_for_each_safe(pos, tmp, &pm->replicas)
        {
            total += plan_holds(container_of(pos, struct replica, node));
        }
    }
    if (total > pb->cap_held) {
        struct wp_held *held = realloc(pb->plan_held, total * sizeof *held);
        pb->plan_held = held ? held : pb->plan_held;
        size_t *whose = realloc(pb->plan_held_model, total * sizeof *whose);
        pb->plan_held_model = whose ? whose : pb->plan_held_model;
        if (!held || !whose) {
            return;
        }
        pb->cap_held = total;
    }
    size_t at = 0;
    for (size_t g = 0; g < pb->n_gpus && total; g++) {
        struct wp_node *node = &pb->plan_nodes[g];
        node->held = pb->plan_held + at;
        node->held_model = pb->plan_held_model + at;
        for (size_t i = 0; i < n; i++) {
            struct proc_model *pm = container_of(sms[i], struct proc_model, sc);
            struct list_node *pos, *tmp;
            list_for_each_safe(pos, tmp, &pm->replicas)
            {
                const struct replica *r = container_of(pos, struct replica, node);
                if (r->gpu == (int)g && plan_holds(r)) {
                    pb->plan_held[at] = (struct wp_held){.memory = r->gpu_memory,
                                                         .tier = pm->m->set.priority,
                                                         .sleepable = sleepable_now(r)};
                    pb->plan_held_model[at++] = i;
                    node->n_held++;
                }
            }
        }
    }
}

/* The warm pool plans on GPU units as its nodes: each whole GPU (its slices
 * and, when declared, its memory) and each MIG instance (one of its profile).
 * A replica fits only where one unit has room for all it needs, so an
 * eviction or preemption frees room on the unit where the newcomer then
 * fits, never some on each of several. Which unit a start takes is still
 * procplan_gpu_place's choice; a stop takes a replica where the plan keeps
 * fewer than run (apply_target). */
static bool plan_nodes(void *ud, struct scaler_model **sms, size_t n, struct wp_cluster *c)
{
    struct process_backend *pb = ud;
    if (pb->n_gpus == 0) {
        return false;
    }
    if (!pb->plan_nodes) {
        pb->plan_nodes = calloc(pb->n_gpus, sizeof *pb->plan_nodes);
        pb->plan_names = calloc(pb->n_gpus, sizeof *pb->plan_names);
        if (!pb->plan_nodes || !pb->plan_names) {
            free(pb->plan_nodes);
            free(pb->plan_names);
            pb->plan_nodes = NULL;
            pb->plan_names = NULL;
            return false;
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct proc_model *pm = container_of(sms[i], struct proc_model, sc);
        if (!pm->plan_on_gpu && !(pm->plan_on_gpu = calloc(pb->n_gpus, sizeof(unsigned)))) {
            return false;
        }
    }
    size_t n_res = 1;
    c->res[0] = "gpu-slices";
    for (size_t g = 0; g < pb->n_gpus; g++) {
        const struct gpu_slot *s = &pb->gpus[g];
        struct wp_node *node = &pb->plan_nodes[g];
        memset(node, 0, sizeof *node);
        node->name = pb->plan_names[g];
        size_t r = 0;
        if (s->profile) {
            snprintf(pb->plan_names[g], sizeof pb->plan_names[g], "gpu%d:%s", s->id, s->profile);
            for (r = 1; r < n_res && strcmp(c->res[r], s->profile) != 0; r++) {
            }
            if (r == n_res && n_res < WP_MAX_RES) {
                c->res[n_res++] = s->profile;
            }
        } else {
            snprintf(pb->plan_names[g], sizeof pb->plan_names[g], "gpu%d", s->id);
            node->gpu_memory = s->memory_bytes;
            node->gpus = s->memory_bytes ? 1 : 0;
        }
        if (r < n_res) {
            node->alloc[r] = s->slices;
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct proc_model *pm = container_of(sms[i], struct proc_model, sc);
        memset(sms[i]->req, 0, sizeof sms[i]->req);
        if (pm->mig_profile) {
            for (size_t r = 1; r < n_res; r++) {
                if (strcmp(c->res[r], pm->mig_profile) == 0) {
                    sms[i]->req[r] = 1;
                }
            }
        } else {
            sms[i]->req[0] = pm->gpu_slices;
        }
        sms[i]->gpu_memory = planned_memory(pm);
        sms[i]->memory_sleeps = pm->sleep.enabled;
        sms[i]->eligible = NULL;
        /* Where its replicas run; one without a GPU (a model that needs
         * none) counts on the first unit, where it takes nothing. An
         * asleep one whose wake waits for memory is placed nowhere yet: the
         * plan makes room for it as for a start (a higher tier's wake
         * preempts a lower tier's replica holding its memory). */
        memset(pm->plan_on_gpu, 0, pb->n_gpus * sizeof(unsigned));
        struct list_node *pos, *tmp;
        list_for_each_safe(pos, tmp, &pm->replicas)
        {
            const struct replica *r = container_of(pos, struct replica, node);
            if (held_state(r->state) && !r->wake_waits) {
                pm->plan_on_gpu[r->gpu >= 0 ? (size_t)r->gpu : 0]++;
            }
        }
        sms[i]->on_node = pm->plan_on_gpu;
    }
    plan_held(pb, sms, n);
    c->n_res = n_res;
    c->nodes = pb->plan_nodes;
    c->n_nodes = pb->n_gpus;
    return true;
}

static const struct scale_driver_ops process_scale_ops = {
    .count = count_models,
    .collect = collect_models,
    .gpu_slices = gpu_slices,
    .apply = apply_targets,
    .nodes = plan_nodes,
};

/* One planning step over every model (scale_driver.h), then start and stop. */
static void plan_all(struct process_backend *pb)
{
    scale_driver_plan(&pb->driver, pb->cfg);
}

static void reconcile_all(struct process_backend *pb)
{
    uint64_t now = clock_now_ms();
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &pb->models)
    {
        struct proc_model *pm = container_of(pos, struct proc_model, node);
        scaler_record(&pm->sc, now);
        sleep_tick(pm, now);
        /* Startup timeouts. */
        struct list_node *rp, *rt;
        list_for_each_safe(rp, rt, &pm->replicas)
        {
            struct replica *r = container_of(rp, struct replica, node);
            /* A replica the sleep tick started is younger than `now`. */
            if (r->state == R_STARTING &&
                ms_since(now, r->started_ms) >= pm->startup_timeout_ms) {
                char why[96];
                snprintf(why, sizeof why, "not ready within startup_timeout_ms=%llu",
                         (unsigned long long)pm->startup_timeout_ms);
                replica_stop(r, why);
                start_failed(pm, r, why);
            }
        }
        /* Every start of a cold start failed: nothing is loading now. */
        if (pm->m->cold.started_ms && pm->n_starting == 0 && pm->n_ready == 0) {
            coldstart_cancel(&pm->m->cold);
        }
    }
    if (scale_driver_due(&pb->driver, now)) {
        plan_all(pb);
    }
}

static void proc_model_free(struct proc_model *pm)
{
    while (!list_empty(&pm->replicas)) {
        replica_free(container_of(list_first(&pm->replicas), struct replica, node));
    }
    list_remove(&pm->node);
    for (size_t i = 0; i < pm->argc; i++) {
        free(pm->argv[i]);
    }
    free(pm->argv);
    for (size_t i = 0; i < pm->n_env; i++) {
        free(pm->env[i]);
    }
    free(pm->env);
    free(pm->health_path);
    free(pm->mig_profile);
    free(pm->plan_on_gpu);
    scaler_model_dispose(&pm->sc);
    model_unref(pm->m);
    free(pm);
}

/* Removed models: stop drained replicas; forget the model when none is left. */
static void reap_retired(struct process_backend *pb)
{
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &pb->retired)
    {
        struct proc_model *pm = container_of(pos, struct proc_model, node);
        stop_drained(pm);
        if (list_empty(&pm->replicas)) {
            LOGI("removed model's processes all stopped", "model=%s", pm->m->name);
            proc_model_free(pm);
        }
    }
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct process_backend *pb = arg;
    if (!pb->stopping) {
        struct list_node *pos, *tmp;
        list_for_each_safe(pos, tmp, &pb->models)
        {
            stop_drained(container_of(pos, struct proc_model, node));
        }
        reap_retired(pb);
        reconcile_all(pb);
    }
}

static struct replica *find_pid_in(struct list_node *models, pid_t pid)
{
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, models)
    {
        struct proc_model *pm = container_of(pos, struct proc_model, node);
        struct list_node *rp, *rt;
        list_for_each_safe(rp, rt, &pm->replicas)
        {
            struct replica *r = container_of(rp, struct replica, node);
            if (r->pid == pid) {
                return r;
            }
        }
    }
    return NULL;
}

static struct replica *find_pid(struct process_backend *pb, pid_t pid)
{
    struct replica *r = find_pid_in(&pb->models, pid);
    return r ? r : find_pid_in(&pb->retired, pid);
}

/* A crash loop (ready, then gone within CRASH_LOOP_MS having finished no
 * request, again and again, awake or asleep) backs off as failed starts
 * do, not restarted at once. One that served (killed by the OOM killer
 * under load, say) resets the count. Returns the back-off (0: none). */
static uint64_t crash_backoff(struct proc_model *pm, const struct replica *r, uint64_t now)
{
    bool served = pm->m->stats.proxied > r->proxied_at_ready;
    if (ms_since(now, r->ready_ms) >= CRASH_LOOP_MS || served) {
        pm->quick_crashes = 0;
        return 0;
    }
    uint64_t backoff = procplan_restart_backoff_ms(++pm->quick_crashes);
    pm->backoff_until_ms = now + backoff;
    return backoff;
}

static void describe_exit(int status, char *out, size_t len)
{
    if (WIFEXITED(status)) {
        snprintf(out, len, "exited with status %d", WEXITSTATUS(status));
    } else if (WIFSIGNALED(status)) {
        snprintf(out, len, "killed by signal %d", WTERMSIG(status));
    } else {
        snprintf(out, len, "ended (status %d)", status);
    }
}

static void reaped(struct process_backend *pb, pid_t pid, int status)
{
    struct replica *r = find_pid(pb, pid);
    if (!r) {
        return;
    }
    struct proc_model *pm = r->pm;
    r->exited = true;
    kill(-pid, SIGKILL); /* anything it left behind in its group */
    char how[64];
    describe_exit(status, how, sizeof how);
    switch (r->state) {
    case R_STARTING: {
        pm->n_starting--;
        char why[128];
        snprintf(why, sizeof why, "%s before becoming ready", how);
        if (!pb->stopping) {
            start_failed(pm, r, why);
        }
        replica_free(r);
        break;
    }
    case R_READY: {
        pm->n_ready--;
        pm->crashes++;
        uint64_t now = clock_now_ms(), backoff = crash_backoff(pm, r, now);
        LOGW("replica crashed while serving",
             "model=%s replica=%s how=\"%s\" ready_for_ms=%llu restart_in_ms=%llu", pm->m->name,
             r->id, how, (unsigned long long)ms_since(now, r->ready_ms),
             (unsigned long long)backoff);
        log_last_lines(r);
        fleet_replica_gone(pm->m->fleet, pm->m, r->id, how);
        replica_free(r);
        break;
    }
    case R_DRAINING:
        pm->n_draining--;
        LOGW("replica exited while draining", "model=%s replica=%s how=\"%s\"", pm->m->name,
             r->id, how);
        replica_free(r);
        break;
    case R_STOPPING:
        pm->n_stopping--;
        LOGI("replica stopped", "model=%s replica=%s how=\"%s\"", pm->m->name, r->id, how);
        replica_free(r);
        break;
    case R_DOZING:
    case R_ASLEEP:
    case R_WAKING: {
        pm->crashes++;
        /* Nothing asked for it (a wake's held requests are demand): a
         * replacement would load only to sleep, and maybe die, again. */
        pm->yielded = true;
        uint64_t now = clock_now_ms(), backoff = crash_backoff(pm, r, now);
        LOGW("replica exited in sleep mode", "model=%s replica=%s how=\"%s\" "
             "ready_for_ms=%llu restart_in_ms=%llu", pm->m->name, r->id, how,
             (unsigned long long)ms_since(now, r->ready_ms), (unsigned long long)backoff);
        log_last_lines(r);
        sleep_state_leave(r);
        replica_free(r);
        break;
    }
    }
}

static void on_sigchld(evutil_socket_t sig, short what, void *arg)
{
    struct process_backend *pb = arg;
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) {
            break;
        }
        reaped(pb, pid, status);
    }
    if (!pb->stopping) {
        plan_all(pb); /* freed slices may let a waiting model start */
    }
}

/* ---- backend ops ------------------------------------------------------- */

static char **copy_strv(char **src, size_t n)
{
    char **v = calloc(n + 1, sizeof *v);
    if (!v) {
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        v[i] = strdup(src[i]);
    }
    return v;
}

static bool same_strv(char **a, size_t na, char **b, size_t nb)
{
    if (na != nb) {
        return false;
    }
    for (size_t i = 0; i < na; i++) {
        if (strcmp(a[i], b[i]) != 0) {
            return false;
        }
    }
    return true;
}

/* Does cm describe the same processes as pm runs? */
static bool same_definition(const struct proc_model *pm, const struct config_model *cm)
{
    return same_strv(pm->argv, pm->argc, cm->command, cm->n_command) &&
           same_strv(pm->env, pm->n_env, cm->env, cm->n_env) &&
           strcmp(pm->health_path, cm->health_path) == 0 && pm->gpu_slices == cm->gpu_slices &&
           pm->gpu_memory_bytes == cm->gpu_memory_bytes &&
           !pm->mig_profile == !cm->mig_profile &&
           (!pm->mig_profile || strcmp(pm->mig_profile, cm->mig_profile) == 0);
}

/* Copies cm's process settings into pm (replacing what it had). */
static int take_definition(struct proc_model *pm, const struct config_model *cm)
{
    char **argv = copy_strv(cm->command, cm->n_command);
    char **env = copy_strv(cm->env, cm->n_env);
    char *health = strdup(cm->health_path);
    char *mig = cm->mig_profile ? strdup(cm->mig_profile) : NULL;
    if (!argv || !env || !health || (cm->mig_profile && !mig)) {
        free_strv(argv);
        free_strv(env);
        free(health);
        free(mig);
        return -ENOMEM;
    }
    free(pm->mig_profile);
    pm->mig_profile = mig;
    pm->gpu_memory_bytes = cm->gpu_memory_bytes;
    free_strv(pm->argv);
    free_strv(pm->env);
    free(pm->health_path);
    pm->argv = argv;
    pm->argc = cm->n_command;
    pm->env = env;
    pm->n_env = cm->n_env;
    pm->health_path = health;
    pm->min_replicas = (unsigned)cm->min_replicas;
    pm->max_replicas = (unsigned)cm->max_replicas;
    pm->gpu_slices = (unsigned)cm->gpu_slices;
    pm->idle_timeout_ms = cm->idle_timeout_ms;
    pm->startup_timeout_ms = cm->startup_timeout_ms;
    pm->stop_grace_ms = cm->stop_grace_ms;
    pm->stop_drain_ms = cm->stop_drain_ms;
    if (memcmp(&pm->sleep, &cm->sleep, sizeof pm->sleep) != 0) {
        pm->sleep_timed_out = false; /* new sleep settings: tried again */
    }
    pm->sleep = cm->sleep;
    /* New autoscaler numbers; the demand it has seen stays (a fresh start
     * would see none and could stop replicas that are busy), unless the
     * window, which sizes its buckets, changed. */
    struct scaler_model fresh;
    scaler_model_init(&fresh, pm->m, pm->pb->cfg, cm->target, cm->stable_window_ms,
                      pm->min_replicas, pm->max_replicas, pm->idle_timeout_ms,
                      pm->mig_profile ? 1 : pm->gpu_slices);
    fresh.prewarm = cm->prewarm;
    pm->sc.prewarm = cm->prewarm;
    if (!pm->sc.m || pm->sc.asc.stable_window_ms != fresh.asc.stable_window_ms) {
        fresh.fc = pm->sc.fc; /* the demand profile outlives a new window */
        fresh.fc_count = pm->sc.fc_count;
        fresh.served_seen = pm->sc.served_seen;
        pm->sc = fresh;
    } else {
        pm->sc.asc = fresh.asc;
        pm->sc.min_replicas = fresh.min_replicas;
        pm->sc.slices = fresh.slices;
    }
    return 0;
}

static int process_attach(struct backend *b, struct model *m, const struct config_model *cm)
{
    struct process_backend *pb = PB(b);
    struct proc_model *pm = calloc(1, sizeof *pm);
    if (!pm) {
        return -ENOMEM;
    }
    pm->pb = pb;
    pm->m = m;
    model_ref(m);
    list_node_init(&pm->node);
    list_init(&pm->replicas);
    if (take_definition(pm, cm)) {
        proc_model_free(pm);
        return -ENOMEM;
    }
    list_push_back(&pb->models, &pm->node);
    m->backend = b;
    m->backend_data = pm;
    plan_all(pb); /* min_replicas start now */
    return 0;
}

/* A reload changed the model. A new command, environment, health path or
 * GPU share means new processes: the running ones are drained (no new
 * requests, stopped when their last one ends) and as many replacements
 * start at once. Replica counts and timeouts apply in place. */
static int process_update(struct backend *b, struct model *m, const struct config_model *cm)
{
    struct proc_model *pm = m->backend_data;
    bool replace = !same_definition(pm, cm);
    unsigned had = pm->n_ready + pm->n_starting;
    if (take_definition(pm, cm)) {
        return -ENOMEM;
    }
    if (replace) {
        LOGI("model command changed: replacing its processes", "model=%s replicas=%u", m->name,
             had);
        struct list_node *pos, *tmp;
        list_for_each_safe(pos, tmp, &pm->replicas)
        {
            replica_drain(container_of(pos, struct replica, node), "definition changed");
        }
        pm->failures = 0;
        pm->backoff_until_ms = 0;
        pm->last_error[0] = '\0';
        if (had > pm->max_replicas) {
            had = pm->max_replicas;
        }
        if (had < pm->min_replicas) {
            had = pm->min_replicas;
        }
        apply_target(pm, had, "definition changed");
    }
    plan_all(pm->pb);
    return 0;
}

/* A reload removed the model: its replicas drain and stop; its state stays
 * (on the retired list, with a reference to the model) until they are gone. */
static void process_retire(struct backend *b, struct model *m)
{
    struct process_backend *pb = PB(b);
    struct proc_model *pm = m->backend_data;
    list_remove(&pm->node);
    list_push_back(&pb->retired, &pm->node);
    pm->retired = true;
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &pm->replicas)
    {
        replica_drain(container_of(pos, struct replica, node), "model removed");
    }
}

static void process_set_config(struct backend *b, const struct config *cfg)
{
    PB(b)->cfg = cfg;
}

/* Demand arrived for a model with no ready replica: start one now rather
 * than at the next tick. -EAGAIN while a failed start is backing off. */
/* Demand arrived for a model with no ready replica: plan now rather than at
 * the next tick (the autoscaler sees the held request as demand, panics with
 * nothing ready, and asks for the activation scale). -EAGAIN while a failed
 * start is backing off. */
static int process_scale(struct backend *b, struct model *m, unsigned replicas)
{
    struct proc_model *pm = m->backend_data;
    uint64_t now = clock_now_ms();
    pm->yielded = false; /* demand: it may start again */
    if (pm->n_ready == 0 && pm->n_starting == 0 && pm->n_waking == 0 && pm->n_asleep) {
        /* The request queues right after this: wake one now, not at the tick. */
        struct list_node *pos, *tmp;
        list_for_each_safe(pos, tmp, &pm->replicas)
        {
            struct replica *r = container_of(pos, struct replica, node);
            if (r->state == R_ASLEEP) {
                replica_wake(r);
                break;
            }
        }
        return 0;
    }
    if (pm->n_ready == 0 && pm->n_starting == 0 && pm->n_waking == 0 && pm->n_dozing) {
        return 0; /* woken as soon as it is asleep (on_slept) */
    }
    if (pm->n_ready == 0 && pm->n_starting == 0 && now < pm->backoff_until_ms) {
        return -EAGAIN;
    }
    if (pm->n_ready + pm->n_starting + pm->n_waking >= replicas) {
        return 0; /* one start per need */
    }
    as_record(&pm->sc.ass, now, model_demand(m) + 1);
    pm->poked = true; /* the request queues right after this */
    plan_all(pm->pb);
    return 0;
}

static uint64_t process_retry_after_ms(struct backend *b, struct model *m)
{
    struct proc_model *pm = m->backend_data;
    uint64_t now = clock_now_ms();
    if (pm->n_ready == 0 && pm->n_starting == 0 && now < pm->backoff_until_ms) {
        return pm->backoff_until_ms - now;
    }
    if (pm->n_waking + pm->n_asleep + pm->n_dozing && pm->last_wake_ms) {
        return pm->last_wake_ms;
    }
    uint64_t remaining;
    if (coldstart_remaining_ms(&m->cold, now, &remaining)) {
        return remaining;
    }
    return m->cold_start_ms;
}

static const char *replica_state_name(enum replica_state s)
{
    switch (s) {
    case R_STARTING: return "starting";
    case R_READY: return "ready";
    case R_DRAINING: return "draining";
    case R_STOPPING: return "stopping";
    case R_DOZING: return "falling_asleep";
    case R_ASLEEP: return "sleeping";
    case R_WAKING: return "waking";
    }
    return "unknown";
}

static void process_describe(struct backend *b, struct model *m, cJSON *out)
{
    struct proc_model *pm = m->backend_data;
    uint64_t now = clock_now_ms();
    const char *state = pm->n_ready             ? "ready"
                        : pm->n_waking          ? "waking"
                        : pm->waiting_for_capacity ? "waiting_for_capacity"
                        : pm->n_starting        ? "starting"
                        : pm->n_asleep          ? "sleeping"
                        : pm->n_dozing          ? "falling_asleep"
                        : now < pm->backoff_until_ms ? "start_failed"
                                                      : "scaled_to_zero";
    cJSON_AddStringToObject(out, "backend", "process");
    cJSON_AddStringToObject(out, "state", state);
    cJSON_AddNumberToObject(out, "replicas_ready", pm->n_ready);
    cJSON_AddNumberToObject(out, "replicas_starting", pm->n_starting);
    cJSON_AddNumberToObject(out, "replicas_draining", pm->n_draining);
    cJSON_AddNumberToObject(out, "replicas_stopping", pm->n_stopping);
    cJSON_AddNumberToObject(out, "replicas_sleeping", pm->n_asleep + pm->n_dozing);
    cJSON_AddNumberToObject(out, "replicas_waking", pm->n_waking);
    if (pm->sleep.enabled) {
        cJSON *sl = cJSON_AddObjectToObject(out, "sleep");
        cJSON_AddNumberToObject(sl, "level", (double)pm->sleep.level);
        cJSON_AddNumberToObject(sl, "idle_before_sleep_ms", (double)pm->sleep.idle_before_sleep_ms);
        cJSON_AddNumberToObject(sl, "last_wake_ms", (double)pm->last_wake_ms);
        cJSON_AddNumberToObject(sl, "sleeps", (double)pm->m->stats.sleeps);
        cJSON_AddNumberToObject(sl, "wakes", (double)pm->m->stats.wakes);
    }
    cJSON_AddNumberToObject(out, "min_replicas", pm->min_replicas);
    cJSON_AddNumberToObject(out, "max_replicas", pm->max_replicas);
    cJSON_AddNumberToObject(out, "gpu_slices", pm->gpu_slices);
    cJSON_AddNumberToObject(out, "cold_start_ms", (double)pm->last_cold_start_ms);
    cJSON_AddNumberToObject(out, "starts", (double)pm->starts);
    cJSON_AddNumberToObject(out, "start_failures", (double)pm->start_failures);
    cJSON_AddNumberToObject(out, "crashes", (double)pm->crashes);
    if (pm->last_error[0]) {
        cJSON_AddStringToObject(out, "last_error", pm->last_error);
    }
    if (now < pm->backoff_until_ms) {
        cJSON_AddNumberToObject(out, "retry_in_ms", (double)(pm->backoff_until_ms - now));
    }
    if (pm->idle_since_ms && pm->n_ready) {
        cJSON_AddNumberToObject(out, "idle_ms", (double)ms_since(now, pm->idle_since_ms));
    }
    scaler_describe(&pm->sc, out);
    cJSON *procs = cJSON_AddArrayToObject(out, "processes");
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &pm->replicas)
    {
        struct replica *r = container_of(pos, struct replica, node);
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "id", r->id);
        cJSON_AddNumberToObject(j, "pid", r->pid);
        cJSON_AddNumberToObject(j, "port", r->port);
        cJSON_AddStringToObject(j, "state", replica_state_name(r->state));
        if (r->gpu >= 0) {
            cJSON_AddNumberToObject(j, "gpu", r->pm->pb->gpus[r->gpu].id);
        }
        cJSON_AddNumberToObject(j, "age_ms", (double)ms_since(now, r->started_ms));
        cJSON_AddItemToArray(procs, j);
    }
}

static void process_describe_capacity(struct backend *b, cJSON *out)
{
    struct process_backend *pb = PB(b);
    cJSON *gpus = cJSON_AddArrayToObject(out, "gpus");
    for (size_t i = 0; i < pb->n_gpus; i++) {
        cJSON *g = cJSON_CreateObject();
        cJSON_AddNumberToObject(g, "id", pb->gpus[i].id);
        cJSON_AddStringToObject(g, "sharing", pb->sharing[i] == GPU_MPS ? "mps" : "time-slicing");
        cJSON_AddNumberToObject(g, "slices", pb->gpus[i].slices);
        cJSON_AddNumberToObject(g, "used", pb->gpus[i].used);
        if (pb->gpus[i].profile) {
            cJSON_AddStringToObject(g, "mig", pb->gpu_device[i]);
            cJSON_AddStringToObject(g, "profile", pb->gpus[i].profile);
        }
        if (pb->gpus[i].memory_bytes) {
            cJSON_AddNumberToObject(g, "memory_bytes", (double)pb->gpus[i].memory_bytes);
            cJSON_AddNumberToObject(g, "memory_used", (double)pb->gpus[i].memory_used);
        }
        cJSON_AddItemToArray(gpus, g);
    }
}

/* At exit: SIGTERM every child's group, wait up to the longest grace, then
 * SIGKILL what is left, and reap everything. Runs after the event loop. */
static void process_stop(struct backend *b)
{
    struct process_backend *pb = PB(b);
    pb->stopping = true;
    /* Removed models' draining processes stop with the rest. */
    while (!list_empty(&pb->retired)) {
        struct list_node *n = list_first(&pb->retired);
        list_remove(n);
        list_push_back(&pb->models, n);
    }
    unsigned alive = 0;
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &pb->models)
    {
        struct proc_model *pm = container_of(pos, struct proc_model, node);
        struct list_node *rp, *rt;
        list_for_each_safe(rp, rt, &pm->replicas)
        {
            struct replica *r = container_of(rp, struct replica, node);
            if (!r->exited) {
                kill(-r->pid, SIGTERM);
                alive++;
            }
        }
    }
    /* Each replica has its own model's stop_grace_ms to go. */
    uint64_t since = clock_now_ms();
    bool all_killed = false;
    while (alive > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid > 0) {
            struct replica *r = find_pid(pb, pid);
            if (r && !r->exited) {
                r->exited = true;
                alive--;
            }
            continue;
        }
        if (pid < 0 && errno == ECHILD) {
            break;
        }
        if (!all_killed) {
            uint64_t waited = clock_now_ms() - since;
            all_killed = true;
            list_for_each_safe(pos, tmp, &pb->models)
            {
                struct proc_model *pm = container_of(pos, struct proc_model, node);
                struct list_node *rp, *rt;
                list_for_each_safe(rp, rt, &pm->replicas)
                {
                    struct replica *r = container_of(rp, struct replica, node);
                    if (r->exited || r->killed_at_exit) {
                        continue;
                    }
                    if (waited < pm->stop_grace_ms) {
                        all_killed = false;
                        continue;
                    }
                    LOGW("replica ignored SIGTERM at exit: SIGKILL", "model=%s replica=%s",
                         pm->m->name, r->id);
                    kill(-r->pid, SIGKILL);
                    r->killed_at_exit = true;
                }
            }
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    /* Anything left in the groups (grandchildren). */
    list_for_each_safe(pos, tmp, &pb->models)
    {
        struct proc_model *pm = container_of(pos, struct proc_model, node);
        struct list_node *rp, *rt;
        list_for_each_safe(rp, rt, &pm->replicas)
        {
            struct replica *r = container_of(rp, struct replica, node);
            kill(-r->pid, SIGKILL);
        }
    }
    LOGI("all model processes stopped", NULL);
}

static void process_free(struct backend *b)
{
    struct process_backend *pb = PB(b);
    while (!list_empty(&pb->models)) {
        proc_model_free(container_of(list_first(&pb->models), struct proc_model, node));
    }
    while (!list_empty(&pb->retired)) {
        proc_model_free(container_of(list_first(&pb->retired), struct proc_model, node));
    }
    if (pb->sigchld) {
        event_free(pb->sigchld);
    }
    if (pb->tick) {
        event_free(pb->tick);
    }
    for (size_t i = 0; i < pb->n_gpus; i++) {
        free(pb->gpu_device ? pb->gpu_device[i] : NULL);
        free(pb->gpu_profile ? pb->gpu_profile[i] : NULL);
    }
    free(pb->gpu_device);
    free(pb->gpu_profile);
    free(pb->plan_nodes);
    free(pb->plan_names);
    free(pb->plan_held);
    free(pb->plan_held_model);
    free(pb->gpus);
    free(pb->sharing);
    free(pb);
}

static int process_check_config(struct backend *b, const struct config *cfg, char *err,
                                size_t errlen);

static void process_draining(struct backend *b)
{
    PB(b)->draining = true;
}

static const struct backend_ops process_ops = {
    .name = "process",
    .attach = process_attach,
    .scale = process_scale,
    .retry_after_ms = process_retry_after_ms,
    .describe = process_describe,
    .describe_capacity = process_describe_capacity,
    .update = process_update,
    .retire = process_retire,
    .set_config = process_set_config,
    .check_config = process_check_config,
    .draining = process_draining,
    .stop = process_stop,
    .free = process_free,
};

/* ---- GPUs -------------------------------------------------------------- */

static int gpus_alloc(struct process_backend *pb, size_t n)
{
    pb->n_gpus = 0;
    pb->gpus = calloc(n ? n : 1, sizeof *pb->gpus);
    pb->sharing = calloc(n ? n : 1, sizeof *pb->sharing);
    pb->gpu_device = calloc(n ? n : 1, sizeof *pb->gpu_device);
    pb->gpu_profile = calloc(n ? n : 1, sizeof *pb->gpu_profile);
    return pb->gpus && pb->sharing && pb->gpu_device && pb->gpu_profile ? 0 : -ENOMEM;
}

/* Appends a capacity unit: GPU id, or a MIG instance of it (mig UUID and
 * profile). 0 or -ENOMEM. */
static int gpu_add(struct process_backend *pb, int id, unsigned slices, enum gpu_sharing sharing,
                   const char *mig, const char *profile, uint64_t memory_bytes)
{
    size_t i = pb->n_gpus;
    char idbuf[16];
    snprintf(idbuf, sizeof idbuf, "%d", id);
    pb->gpu_device[i] = strdup(mig ? mig : idbuf);
    pb->gpu_profile[i] = profile ? strdup(profile) : NULL;
    if (!pb->gpu_device[i] || (profile && !pb->gpu_profile[i])) {
        return -ENOMEM;
    }
    pb->gpus[i] = (struct gpu_slot){.id = id, .slices = mig ? 1 : slices,
                                    .profile = pb->gpu_profile[i],
                                    .memory_bytes = memory_bytes};
    pb->sharing[i] = sharing;
    pb->n_gpus++;
    return 0;
}

static int declared_gpus(struct process_backend *pb, const struct config *cfg)
{
    if (gpus_alloc(pb, cfg->n_gpus)) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < cfg->n_gpus; i++) {
        const struct config_gpu *g = &cfg->gpus[i];
        if (gpu_add(pb, (int)g->id, (unsigned)g->slices, g->sharing, g->mig, g->profile,
                    g->memory_bytes)) {
            return -ENOMEM;
        }
    }
    return 0;
}

/* ---- GPU discovery ------------------------------------------------------ */

/* "gpus": "discover": the GPUs and MIG instances nvidia-smi -L lists (or
 * gpu_discovery_command), run as a command (command.h: no shell, its own
 * process group killed at the deadline, stderr logged quoted). A GPU in
 * MIG mode gives one unit per instance; the others one unit each, shared by
 * time-slicing in gpu_discovery_slices. */
#define DISCOVERY_TIMEOUT_MS 5000
#define DISCOVERY_MAX_OUTPUT 65536
#define DISCOVERY_MAX_DEVICES 256

static const char *discovery_name(const struct config *cfg)
{
    return cfg->n_gpu_discovery_command ? cfg->gpu_discovery_command[0] : "nvidia-smi";
}

static void log_discovery_failure(const struct config *cfg, const struct command *run)
{
    char how[400];
    command_end_fields(run, how, sizeof how);
    LOGE("GPU discovery command failed", "command=%s %s", LOG_Q(discovery_name(cfg)), how);
}

/* Runs the command: waits for it (done NULL: start-up), or starts it on
 * base. 0, or -1 when it could not be started (logged). */
static int discovery_run(struct command *run, const struct config *cfg, struct event_base *base,
                         command_done_fn done, void *ud)
{
    static char *const default_cmd[] = {"nvidia-smi", "-L"};
    size_t n = cfg->n_gpu_discovery_command ? cfg->n_gpu_discovery_command : 2;
    char **argv = calloc(n + 1, sizeof *argv);
    if (!argv) {
        LOGE("out of memory starting GPU discovery", NULL);
        return -1;
    }
    memcpy(argv, cfg->n_gpu_discovery_command ? cfg->gpu_discovery_command : default_cmd,
           n * sizeof *argv);
    struct command_spec spec = {.task = "gpu_discovery", .argv = argv,
                                .timeout_ms = DISCOVERY_TIMEOUT_MS,
                                .max_output = DISCOVERY_MAX_OUTPUT};
    if (done) {
        command_start(run, base, &spec, done, ud);
    } else {
        command_run(run, &spec);
    }
    free(argv);
    if (run->end == COMMAND_NOT_RUN) {
        log_discovery_failure(cfg, run);
        return -1;
    }
    return 0;
}

/* The GPUs a finished discovery run lists. 0, or -1 with the reason logged. */
static int gpus_from_discovery(struct process_backend *pb, const struct config *cfg,
                               struct command *run)
{
    /* COMMAND_ENDED: another waitpid took its status; its output tells. */
    if (!command_succeeded(run) && run->end != COMMAND_ENDED) {
        log_discovery_failure(cfg, run);
        return -1;
    }
    struct smi_device *devs = calloc(DISCOVERY_MAX_DEVICES, sizeof *devs);
    int rc = -1;
    if (!devs || buf_append(&run->out, "", 1)) {
        goto done;
    }
    int n = procplan_parse_nvidia_smi(run->out.data, devs, DISCOVERY_MAX_DEVICES);
    if (n < 0) {
        LOGE("GPU discovery: the command's output is not nvidia-smi -L output", "command=%s",
             LOG_Q(discovery_name(cfg)));
        goto done;
    }
    if (gpus_alloc(pb, (size_t)n)) {
        goto done;
    }
    for (int i = 0; i < n; i++) {
        const struct smi_device *d = &devs[i];
        if (d->has_mig) {
            continue; /* its instances are the units */
        }
        if (gpu_add(pb, d->gpu, (unsigned)cfg->gpu_discovery_slices, GPU_TIME_SLICING,
                    d->mig ? d->uuid : NULL, d->mig ? d->profile : NULL, 0)) {
            goto done;
        }
        LOGI("GPU discovered", "gpu=%d %s=%s", d->gpu, d->mig ? "mig_profile" : "name",
             LOG_Q(d->mig ? d->profile : d->name));
    }
    rc = 0;
done:
    free(devs);
    return rc;
}

/* Whether m's slices alone fit one whole GPU thaw runs with. */
static bool slices_fit(const struct process_backend *pb, const struct config_model *m)
{
    for (size_t g = 0; g < pb->n_gpus; g++) {
        if (config_gpu_unit_takes(m, pb->gpus[g].profile, pb->gpus[g].slices, 0)) {
            return true;
        }
    }
    return false;
}

/* Every model's GPU needs against the GPUs this backend runs with
 * (discovered, or declared at start: a change to "gpus" needs a restart).
 * A model that fits on none would wait for capacity forever. */
static int process_check_config(struct backend *b, const struct config *cfg, char *err,
                                size_t errlen)
{
    const struct process_backend *pb = PB(b);
    for (size_t i = 0; i < cfg->n_models; i++) {
        const struct config_model *m = &cfg->models[i];
        if (!m->n_command || (!m->gpu_slices && !m->mig_profile)) {
            continue;
        }
        bool fits = false;
        for (size_t g = 0; g < pb->n_gpus && !fits; g++) {
            const struct gpu_slot *s = &pb->gpus[g];
            fits = config_gpu_unit_takes(m, s->profile, s->slices, s->memory_bytes);
        }
        if (!fits) {
            char prefix[96];
            config_model_prefix(cfg, i, prefix, sizeof prefix);
            if (m->mig_profile) {
                snprintf(err, errlen,
                         "%s:%d: %smig_profile: no MIG instance of profile \"%s\" among the %zu "
                         "GPU units thaw runs with (a change to \"gpus\" needs a restart)",
                         cfg->path, m->line, prefix, m->mig_profile, pb->n_gpus);
            } else if (slices_fit(pb, m)) {
                /* The slices fit a GPU: the memory is what does not. */
                snprintf(err, errlen,
                         "%s:%d: %sgpu_memory_bytes: %llu bytes with %llu slices fit on none of "
                         "the %zu GPU units thaw runs with (a change to \"gpus\" needs a "
                         "restart)",
                         cfg->path, m->line, prefix, (unsigned long long)m->gpu_memory_bytes,
                         (unsigned long long)m->gpu_slices, pb->n_gpus);
            } else {
                snprintf(err, errlen,
                         "%s:%d: %sgpu_slices: %llu slices fit on none of the %zu GPU units "
                         "thaw runs with (a change to \"gpus\" needs a restart)",
                         cfg->path, m->line, prefix, (unsigned long long)m->gpu_slices,
                         pb->n_gpus);
            }
            return -EINVAL;
        }
    }
    return 0;
}

/* A backend with no GPUs yet and nothing running. */
static struct process_backend *process_alloc(struct fleet *fleet, struct event_base *base,
                                             const struct config *cfg)
{
    struct process_backend *pb = calloc(1, sizeof *pb);
    if (!pb) {
        return NULL;
    }
    pb->base.ops = &process_ops;
    pb->base.fleet = fleet;
    pb->evbase = base;
    pb->cfg = cfg;
    scale_driver_init(&pb->driver, &process_scale_ops, pb);
    list_init(&pb->models);
    list_init(&pb->retired);
    return pb;
}

/* Its GPUs known: checks the models against discovered ones, and starts
 * reaping and ticking. 0, or -1 (logged). */
static int process_begin(struct process_backend *pb)
{
    const struct config *cfg = pb->cfg;
    char why[600];
    if (cfg->gpu_discovery && process_check_config(&pb->base, cfg, why, sizeof why)) {
        LOGE("a model's GPU needs fit on no GPU found", "error=%s", LOG_Q(why));
        return -1;
    }
    pb->sigchld = evsignal_new(pb->evbase, SIGCHLD, on_sigchld, pb);
    pb->tick = event_new(pb->evbase, -1, EV_PERSIST, on_tick, pb);
    if (!pb->sigchld || !pb->tick) {
        return -1;
    }
    event_add(pb->sigchld, NULL);
    struct timeval tv = {0, TICK_MS * 1000};
    event_add(pb->tick, &tv);
    return 0;
}

struct backend *backend_process_new(struct fleet *fleet, struct event_base *base,
                                    const struct config *cfg)
{
    struct process_backend *pb = process_alloc(fleet, base, cfg);
    if (!pb) {
        return NULL;
    }
    int rc;
    if (cfg->gpu_discovery) {
        struct command run;
        command_init(&run);
        rc = discovery_run(&run, cfg, NULL, NULL, NULL) || gpus_from_discovery(pb, cfg, &run);
        command_dispose(&run);
    } else {
        rc = declared_gpus(pb, cfg);
    }
    if (rc || process_begin(pb)) {
        process_free(&pb->base);
        return NULL;
    }
    return &pb->base;
}

struct backend_process_start {
    struct process_backend *pb; /* its GPUs come from the command */
    struct command run;
    backend_process_started_fn done;
    void *ud;
};

static void on_discovered(struct command *run, void *ud)
{
    struct backend_process_start *s = ud;
    struct process_backend *pb = s->pb;
    backend_process_started_fn done = s->done;
    void *done_ud = s->ud;
    int rc = gpus_from_discovery(pb, pb->cfg, run) || process_begin(pb) ? -1 : 0;
    command_dispose(run);
    free(s);
    if (rc) {
        process_free(&pb->base);
        pb = NULL;
    }
    done(done_ud, pb ? &pb->base : NULL);
}

struct backend_process_start *backend_process_start(struct fleet *fleet, struct event_base *base,
                                                    const struct config *cfg,
                                                    backend_process_started_fn done, void *ud)
{
    struct backend_process_start *s = calloc(1, sizeof *s);
    if (!s || !(s->pb = process_alloc(fleet, base, cfg))) {
        LOGE("out of memory starting the process backend", NULL);
        free(s);
        return NULL;
    }
    command_init(&s->run);
    s->done = done;
    s->ud = ud;
    if (discovery_run(&s->run, cfg, base, on_discovered, s)) {
        backend_process_start_cancel(s);
        return NULL;
    }
    LOGI("GPU discovery started; serving meanwhile", "command=%s timeout_ms=%d",
         LOG_Q(discovery_name(cfg)), DISCOVERY_TIMEOUT_MS);
    return s;
}

void backend_process_start_cancel(struct backend_process_start *s)
{
    command_dispose(&s->run);
    process_free(&s->pb->base);
    free(s);
}
