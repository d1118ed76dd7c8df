/* Running a command for what it prints, without a shell: GPU discovery
 * (nvidia-smi -L) and kubeconfig exec credential plugins.
 *
 * The command runs in its own process group, stdin from /dev/null, every
 * signal at its default and none blocked. Its stdout is kept, up to
 * max_output bytes (more ends the run). Its stderr is read as it comes and
 * its last COMMAND_STDERR_LINES lines (each cut at COMMAND_LINE_MAX bytes)
 * are logged quoted when it ends, at warn unless it exited 0: nothing it
 * prints reaches thaw's log raw. At the deadline, or when it prints too
 * much, its whole process group is SIGKILLed (a wrapper script's children
 * too). The run ends once its stdout is closed and it has been reaped with
 * waitpid on its own pid; a child someone else reaped (the process
 * backend's waitpid(-1) on SIGCHLD) ends as COMMAND_ENDED, how not known.
 * One that SIGKILL has not ended within a second (stuck in the kernel) is
 * left behind, logged, rather than waited for.
 *
 * command_run waits for the command (start-up, before the loop turns);
 * command_start runs it on an event loop and calls done once it has ended.
 * One run at a time per struct command; it may be started again once ended. */
#ifndef THAW_COMMAND_H
#define THAW_COMMAND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <event2/event.h>
#include <event2/event_struct.h>

#include "thaw/buf.h"

#define COMMAND_STDERR_LINES 20
#define COMMAND_LINE_MAX 240

enum command_end {
    COMMAND_NONE,      /* not run yet, or running */
    COMMAND_EXITED,    /* code: its exit status */
    COMMAND_SIGNALED,  /* code: the signal that ended it (not sent by thaw) */
    COMMAND_TIMED_OUT, /* its group was killed at the deadline */
    COMMAND_TOO_MUCH,  /* more than max_output bytes on stdout: its group was killed */
    COMMAND_ENDED,     /* it ended, how is not known (reaped elsewhere) */
    COMMAND_NOT_RUN,   /* could not be started; code: the errno */
};

struct command_spec {
    const char *task;  /* what it is for, in log lines: "gpu_discovery" */
    char *const *argv; /* NULL-terminated; argv[0] is looked up in PATH */
    char *const *envp; /* NULL: thaw's own environment */
    uint64_t timeout_ms;
    size_t max_output;  /* bytes of stdout */
    bool secret_output; /* stdout holds a secret (a token): wiped before it is freed */
};

struct command;
/* The run ended (c->end says how). The callback may dispose of c, free the
 * memory it lives in, or start it again. */
typedef void (*command_done_fn)(struct command *c, void *ud);

struct command {
    /* The outcome, once ended. */
    enum command_end end;
    int code;
    struct buf out; /* its stdout */
    /* The rest is the module's. */
    const char *task;
    char *name; /* argv[0], for logs */
    uint64_t timeout_ms;
    size_t max_output;
    bool secret;
    pid_t pid; /* running and not reaped, or 0 */
    int out_fd, err_fd;
    uint64_t deadline_ms, killed_ms; /* killed_ms: when its group was SIGKILLed */
    unsigned reap_polls;
    bool running, killed;
    struct event_base *base;
    struct event out_ev, err_ev, timer;
    command_done_fn done;
    void *ud;
    char lines[COMMAND_STDERR_LINES][COMMAND_LINE_MAX];
    unsigned line_next, line_count;
    uint64_t lines_seen;
    char partial[COMMAND_LINE_MAX];
    size_t partial_len;
};

/* An idle command: nothing running, no outcome. */
void command_init(struct command *c);
/* Runs the command and waits for it to end. 0 when it exited 0, else -1
 * (c->end says how; the caller logs it, command_end_fields). */
int command_run(struct command *c, const struct command_spec *spec);
/* Starts the command on base; done is called once it has ended. 0, or -1
 * when it could not be started (c->end is COMMAND_NOT_RUN; done is not
 * called). Nothing in spec is used after this returns. */
int command_start(struct command *c, struct event_base *base, const struct command_spec *spec,
                  command_done_fn done, void *ud);
/* A run is under way (command_start's done not called yet). */
bool command_busy(const struct command *c);
/* It exited with status 0. */
bool command_succeeded(const struct command *c);
/* How it ended, in words: "exited with status 9", "was killed by signal
 * SIGSEGV (11)", "did not finish within 5 s (its process group was
 * killed)", ... */
void command_describe(const struct command *c, char *out, size_t len);
/* How it ended as logfmt fields: `how="..." exit_code=9`, `how="..."
 * signal=SIGSEGV signal_number=11`, `how="..." timed_out=true
 * timeout_ms=5000`, ... */
void command_end_fields(const struct command *c, char *out, size_t len);
/* Frees (a secret: wipes first) what it printed on stdout. */
void command_clear_output(struct command *c);
/* Kills (its group) and reaps a run under way, without calling done, and
 * frees the output. The command may be started again after. */
void command_dispose(struct command *c);

#endif
