/* Running a command for what it prints: spawn, stdout kept, stderr logged,
 * a deadline, the process group killed, reaping. See command.h. */
#include "thaw/command.h"
#include "thaw/clock.h"
#include "thaw/log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* After SIGKILL, how long the command gets to be reaped before it is left
 * behind: a process stuck in the kernel (a hung GPU driver) dies only when
 * it leaves it, and thaw must not wait on it. */
#define KILL_GRACE_MS 1000
/* Reads per readiness, so a command that never stops printing cannot keep
 * the loop to itself. */
#define READS_PER_TURN 16
/* A secret's buffer is reserved up front so that growing it leaves no copy
 * of the secret in freed memory (tokens are a few KiB). */
#define SECRET_RESERVE 16384

enum read_result { READ_MORE, READ_EOF, READ_TOO_MUCH };

void command_init(struct command *c)
{
    memset(c, 0, sizeof *c);
    c->out_fd = -1;
    c->err_fd = -1;
    buf_init(&c->out);
}

void command_clear_output(struct command *c)
{
    if (c->secret && c->out.data) {
        memset(c->out.data, 0, c->out.cap);
    }
    buf_dispose(&c->out);
    buf_init(&c->out);
}

bool command_busy(const struct command *c)
{
    return c->running;
}

bool command_succeeded(const struct command *c)
{
    return c->end == COMMAND_EXITED && c->code == 0;
}

/* ---- stderr: lines kept, logged quoted at the end ---------------------- */

static void line_push(struct command *c)
{
    size_t n = c->partial_len < COMMAND_LINE_MAX ? c->partial_len : COMMAND_LINE_MAX - 1;
    char *line = c->lines[c->line_next];
    memcpy(line, c->partial, n);
    if (c->partial_len == COMMAND_LINE_MAX) {
        memcpy(line + n - 3, "...", 3); /* cut */
    }
    if (n && line[n - 1] == '\r') {
        n--;
    }
    line[n] = '\0';
    c->line_next = (c->line_next + 1) % COMMAND_STDERR_LINES;
    if (c->line_count < COMMAND_STDERR_LINES) {
        c->line_count++;
    }
    c->lines_seen++;
    c->partial_len = 0;
}

static void take_stderr(struct command *c, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\n') {
            line_push(c);
        } else if (c->partial_len < COMMAND_LINE_MAX - 1) {
            c->partial[c->partial_len++] = p[i];
        } else {
            c->partial_len = COMMAND_LINE_MAX; /* the rest of a long line is dropped */
        }
    }
}

static void log_stderr(const struct command *c)
{
    enum log_level level = command_succeeded(c) ? LOG_INFO : LOG_WARN;
    if (c->lines_seen > c->line_count) {
        log_write(level, "command stderr: earlier lines left out", "task=%s command=%s lines=%llu",
                  c->task, LOG_Q(c->name), (unsigned long long)(c->lines_seen - c->line_count));
    }
    unsigned first = (c->line_next + COMMAND_STDERR_LINES - c->line_count) % COMMAND_STDERR_LINES;
    for (unsigned i = 0; i < c->line_count; i++) {
        const char *line = c->lines[(first + i) % COMMAND_STDERR_LINES];
        char q[COMMAND_LINE_MAX * 4 + 16];
        log_quote(q, sizeof q, line, strlen(line), COMMAND_LINE_MAX);
        log_write(level, "command stderr", "task=%s command=%s line=%s", c->task, LOG_Q(c->name),
                  q);
    }
}

/* ---- reading ------------------------------------------------------------- */

static void close_fd(struct command *c, int *fd, struct event *ev)
{
    if (*fd < 0) {
        return;
    }
    if (c->base) {
        event_del(ev);
    }
    close(*fd);
    *fd = -1;
}

static void close_out(struct command *c)
{
    close_fd(c, &c->out_fd, &c->out_ev);
}

static void close_err(struct command *c)
{
    close_fd(c, &c->err_fd, &c->err_ev);
}

/* Reads what the pipe has now (its fds are non-blocking). */
static enum read_result read_stdout(struct command *c)
{
    char chunk[4096];
    for (int i = 0; i < READS_PER_TURN; i++) {
        ssize_t got = read(c->out_fd, chunk, sizeof chunk);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return READ_MORE;
        }
        if (got <= 0) {
            return READ_EOF;
        }
        if (c->out.len + (size_t)got > c->max_output || buf_append(&c->out, chunk, (size_t)got)) {
            return READ_TOO_MUCH;
        }
    }
    return READ_MORE;
}

static void read_stderr(struct command *c)
{
    char chunk[4096];
    for (int i = 0; i < READS_PER_TURN; i++) {
        ssize_t got = read(c->err_fd, chunk, sizeof chunk);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return;
        }
        if (got <= 0) {
            close_err(c);
            return;
        }
        take_stderr(c, chunk, (size_t)got);
    }
}

/* ---- ending ----------------------------------------------------------- */

/* The whole group: a wrapper script's children go with it. Nothing more it
 * prints is wanted. */
static void kill_group(struct command *c, enum command_end why)
{
    if (c->end == COMMAND_NONE) {
        c->end = why;
    }
    if (c->pid && !c->killed) {
        kill(-c->pid, SIGKILL);
        c->killed = true;
        c->killed_ms = clock_now_ms();
    }
    close_out(c);
}

static void step_stdout(struct command *c)
{
    enum read_result r = read_stdout(c);
    if (r == READ_EOF) {
        close_out(c);
    } else if (r == READ_TOO_MUCH) {
        kill_group(c, COMMAND_TOO_MUCH);
    }
}

/* true once it is reaped: by us (its status says how it ended) or by
 * another waitpid (ECHILD: how is not known). */
static bool try_reap(struct command *c)
{
    int status = 0;
    pid_t w = waitpid(c->pid, &status, WNOHANG);
    if (w == 0 || (w < 0 && errno == EINTR)) {
        return false;
    }
    if (c->end == COMMAND_NONE) {
        if (w == c->pid && WIFEXITED(status)) {
            c->end = COMMAND_EXITED;
            c->code = WEXITSTATUS(status);
        } else if (w == c->pid && WIFSIGNALED(status)) {
            c->end = COMMAND_SIGNALED;
            c->code = WTERMSIG(status);
        } else {
            c->end = COMMAND_ENDED;
        }
    }
    c->pid = 0;
    return true;
}

/* The run is over: its stdout closed, and it reaped, or killed and left
 * behind after KILL_GRACE_MS. */
static bool over(struct command *c, uint64_t now)
{
    if (!c->killed && now >= c->deadline_ms) {
        kill_group(c, COMMAND_TIMED_OUT);
    }
    if (c->out_fd >= 0 || !c->pid || try_reap(c)) {
        return c->out_fd < 0;
    }
    if (c->killed && now - c->killed_ms >= KILL_GRACE_MS) {
        LOGW("command did not die of SIGKILL: left behind", "task=%s command=%s pid=%d", c->task,
             LOG_Q(c->name), (int)c->pid);
        c->pid = 0;
        return true;
    }
    return false;
}

/* How long to wait for more output, or before looking for its exit again
 * (stdout ends a moment before the process does). */
static uint64_t next_wait_ms(struct command *c, uint64_t now)
{
    uint64_t left = c->killed ? KILL_GRACE_MS : c->deadline_ms > now ? c->deadline_ms - now : 0;
    if (c->out_fd >= 0) {
        return left;
    }
    uint64_t poll_ms = c->reap_polls++ < 10 ? 1 : 10;
    return poll_ms < left ? poll_ms : left;
}

static void finish(struct command *c)
{
    if (c->err_fd >= 0) {
        read_stderr(c); /* what is there already; a child left behind may hold it */
        close_err(c);
    }
    close_out(c);
    if (c->partial_len) {
        line_push(c);
    }
    if (c->base) {
        event_del(&c->timer);
    }
    c->running = false;
    log_stderr(c);
}

/* ---- starting --------------------------------------------------------- */

static void close_pair(int p[2])
{
    for (int i = 0; i < 2; i++) {
        if (p[i] >= 0) {
            close(p[i]);
            p[i] = -1;
        }
    }
}

static int not_run(struct command *c, int err)
{
    c->end = COMMAND_NOT_RUN;
    c->code = err;
    return -1;
}

/* Its own process group; every signal at its default (thaw ignores
 * SIGPIPE, which exec would pass on) and none blocked. */
static void spawn_attr(posix_spawnattr_t *at)
{
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    sigdelset(&all, SIGKILL);
    sigdelset(&all, SIGSTOP);
    posix_spawnattr_init(at);
    posix_spawnattr_setsigmask(at, &none);
    posix_spawnattr_setsigdefault(at, &all);
    posix_spawnattr_setpgroup(at, 0);
    posix_spawnattr_setflags(at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                     POSIX_SPAWN_SETSIGDEF);
}

static void reset(struct command *c, const struct command_spec *spec)
{
    command_clear_output(c); /* a secret from the last run is wiped with its old flag */
    free(c->name);
    c->name = strdup(spec->argv[0]);
    c->task = spec->task;
    c->timeout_ms = spec->timeout_ms;
    c->max_output = spec->max_output;
    c->secret = spec->secret_output;
    c->end = COMMAND_NONE;
    c->code = 0;
    c->pid = 0;
    c->killed = false;
    c->reap_polls = 0;
    c->base = NULL;
    c->line_next = c->line_count = 0;
    c->lines_seen = 0;
    c->partial_len = 0;
}

static int spawn(struct command *c, const struct command_spec *spec)
{
    reset(c, spec);
    if (!c->name) {
        return not_run(c, ENOMEM);
    }
    int outp[2] = {-1, -1}, errp[2] = {-1, -1};
    if (pipe2(outp, O_CLOEXEC) || pipe2(errp, O_CLOEXEC)) {
        int err = errno;
        close_pair(outp);
        close_pair(errp);
        return not_run(c, err);
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, outp[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, errp[1], STDERR_FILENO);
    posix_spawnattr_t at;
    spawn_attr(&at);
    pid_t pid;
    int rc =
        posix_spawnp(&pid, spec->argv[0], &fa, &at, spec->argv, spec->envp ? spec->envp : environ);
    posix_spawnattr_destroy(&at);
    posix_spawn_file_actions_destroy(&fa);
    close(outp[1]);
    close(errp[1]);
    if (rc) {
        close(outp[0]);
        close(errp[0]);
        return not_run(c, rc);
    }
    fcntl(outp[0], F_SETFL, O_NONBLOCK);
    fcntl(errp[0], F_SETFL, O_NONBLOCK);
    c->pid = pid;
    c->out_fd = outp[0];
    c->err_fd = errp[0];
    c->deadline_ms = clock_now_ms() + c->timeout_ms;
    c->running = true;
    if (c->secret) {
        buf_reserve(&c->out, c->max_output < SECRET_RESERVE ? c->max_output : SECRET_RESERVE);
    }
    return 0;
}

/* ---- waiting for it ----------------------------------------------------- */

int command_run(struct command *c, const struct command_spec *spec)
{
    if (spawn(c, spec)) {
        return -1;
    }
    for (;;) {
        uint64_t now = clock_now_ms();
        if (over(c, now)) {
            break;
        }
        struct pollfd p[2];
        nfds_t n = 0;
        if (c->out_fd >= 0) {
            p[n++] = (struct pollfd){c->out_fd, POLLIN, 0};
        }
        if (c->err_fd >= 0) {
            p[n++] = (struct pollfd){c->err_fd, POLLIN, 0};
        }
        if (poll(p, n, (int)next_wait_ms(c, now)) <= 0) {
            continue; /* the time is looked at above; EINTR too */
        }
        for (nfds_t i = 0; i < n; i++) {
            if (!p[i].revents) {
                continue;
            }
            if (p[i].fd == c->out_fd) {
                step_stdout(c);
            } else if (p[i].fd == c->err_fd) {
                read_stderr(c);
            }
        }
    }
    finish(c);
    return command_succeeded(c) ? 0 : -1;
}

/* ---- on the loop ---------------------------------------------------------- */

static void check(struct command *c)
{
    uint64_t now = clock_now_ms();
    if (over(c, now)) {
        command_done_fn done = c->done;
        void *ud = c->ud;
        finish(c);
        done(c, ud); /* may free c */
        return;
    }
    struct timeval tv = clock_timeval(next_wait_ms(c, now));
    event_add(&c->timer, &tv);
}

static void on_stdout(evutil_socket_t fd, short what, void *arg)
{
    struct command *c = arg;
    step_stdout(c);
    if (c->out_fd < 0) {
        check(c);
    }
}

static void on_stderr(evutil_socket_t fd, short what, void *arg)
{
    read_stderr(arg);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    check(arg);
}

int command_start(struct command *c, struct event_base *base, const struct command_spec *spec,
                  command_done_fn done, void *ud)
{
    if (spawn(c, spec)) {
        return -1;
    }
    c->base = base;
    c->done = done;
    c->ud = ud;
    event_assign(&c->out_ev, base, c->out_fd, EV_READ | EV_PERSIST, on_stdout, c);
    event_assign(&c->err_ev, base, c->err_fd, EV_READ | EV_PERSIST, on_stderr, c);
    event_assign(&c->timer, base, -1, 0, on_timer, c);
    event_add(&c->out_ev, NULL);
    event_add(&c->err_ev, NULL);
    struct timeval tv = clock_timeval(c->timeout_ms);
    event_add(&c->timer, &tv);
    return 0;
}

void command_dispose(struct command *c)
{
    if (c->running) {
        kill_group(c, COMMAND_ENDED);
        while (!over(c, clock_now_ms())) {
            struct timespec ts = {0, 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        close_err(c);
        if (c->base) {
            event_del(&c->timer);
        }
        c->running = false;
    }
    command_clear_output(c);
    free(c->name);
    c->name = NULL;
}

/* ---- how it ended ------------------------------------------------------- */

static const char *signal_name(int sig, char *buf, size_t len)
{
    const char *abbrev = sigabbrev_np(sig);
    if (abbrev) {
        snprintf(buf, len, "SIG%s", abbrev);
    } else {
        snprintf(buf, len, "%d", sig);
    }
    return buf;
}

static void format_duration(uint64_t ms, char *out, size_t len)
{
    if (ms % 1000 == 0) {
        snprintf(out, len, "%llu s", (unsigned long long)(ms / 1000));
    } else {
        snprintf(out, len, "%llu ms", (unsigned long long)ms);
    }
}

void command_describe(const struct command *c, char *out, size_t len)
{
    char tmp[32];
    switch (c->end) {
    case COMMAND_EXITED:
        snprintf(out, len, "exited with status %d", c->code);
        break;
    case COMMAND_SIGNALED:
        snprintf(out, len, "was killed by signal %s (%d)", signal_name(c->code, tmp, sizeof tmp),
                 c->code);
        break;
    case COMMAND_TIMED_OUT:
        format_duration(c->timeout_ms, tmp, sizeof tmp);
        snprintf(out, len, "did not finish within %s (its process group was killed)", tmp);
        break;
    case COMMAND_TOO_MUCH:
        snprintf(out, len, "printed more than %zu bytes (its process group was killed)",
                 c->max_output);
        break;
    case COMMAND_ENDED:
        snprintf(out, len, "ended (its exit status went to another waitpid)");
        break;
    case COMMAND_NOT_RUN:
        snprintf(out, len, "could not be run: %s", strerror(c->code));
        break;
    case COMMAND_NONE:
    default:
        snprintf(out, len, "has not ended");
        break;
    }
}

void command_end_fields(const struct command *c, char *out, size_t len)
{
    char how[160], q[400], tmp[32];
    command_describe(c, how, sizeof how);
    log_quote(q, sizeof q, how, strlen(how), sizeof how);
    switch (c->end) {
    case COMMAND_EXITED:
        snprintf(out, len, "how=%s exit_code=%d", q, c->code);
        break;
    case COMMAND_SIGNALED:
        snprintf(out, len, "how=%s signal=%s signal_number=%d", q,
                 signal_name(c->code, tmp, sizeof tmp), c->code);
        break;
    case COMMAND_TIMED_OUT:
        snprintf(out, len, "how=%s timed_out=true timeout_ms=%llu", q,
                 (unsigned long long)c->timeout_ms);
        break;
    case COMMAND_TOO_MUCH:
        snprintf(out, len, "how=%s output_limit_bytes=%zu", q, c->max_output);
        break;
    case COMMAND_NOT_RUN:
        snprintf(out, len, "how=%s errno=%d", q, c->code);
        break;
    default:
        snprintf(out, len, "how=%s", q);
        break;
    }
}
