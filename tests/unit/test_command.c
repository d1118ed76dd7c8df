/* command: output, how it ended, the deadline killing the whole process
 * group, stderr logged quoted, runs on the loop, a child reaped elsewhere. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "thaw/clock.h"
#include "thaw/command.h"

static struct command_spec sh(const char *script, char *argv[4])
{
    argv[0] = "/bin/sh";
    argv[1] = "-c";
    argv[2] = (char *)script;
    argv[3] = NULL;
    return (struct command_spec){
        .task = "test", .argv = argv, .timeout_ms = 5000, .max_output = 65536};
}

static const char *output(struct command *c)
{
    buf_append(&c->out, "", 1);
    c->out.len--;
    return c->out.data ? c->out.data : "";
}

/* What thaw logs while fn runs (log lines go to fd 2). */
static char logged[65536];
static void capture_log(void (*fn)(void *), void *arg)
{
    char path[] = "/tmp/thaw-test-command-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    fn(arg);
    dup2(saved, STDERR_FILENO);
    close(saved);
    ssize_t n = pread(fd, logged, sizeof logged - 1, 0);
    logged[n > 0 ? n : 0] = '\0';
    close(fd);
}

static void run_it(void *arg)
{
    char *argv[4];
    struct command_spec spec = sh("printf 'GPU 0: x'; echo 'no \"driver\"' >&2; "
                                  "printf 'line two\\r\\nunterminated' >&2; exit 9",
                                  argv);
    assert_int_equal(command_run(arg, &spec), -1);
}

static void test_exit_status_output_and_stderr(void **state)
{
    struct command c;
    command_init(&c);
    capture_log(run_it, &c);
    assert_int_equal(c.end, COMMAND_EXITED);
    assert_int_equal(c.code, 9);
    assert_string_equal(output(&c), "GPU 0: x");
    char how[200];
    command_describe(&c, how, sizeof how);
    assert_string_equal(how, "exited with status 9");
    command_end_fields(&c, how, sizeof how);
    assert_string_equal(how, "how=\"exited with status 9\" exit_code=9");
    /* Each stderr line quoted on a line of its own, in order, at warn. */
    assert_non_null(strstr(logged, "level=warn msg=\"command stderr\" task=test "
                                   "command=\"/bin/sh\" line=\"no \\\"driver\\\"\"\n"));
    assert_non_null(strstr(logged, "line=\"line two\"\n"));
    assert_non_null(strstr(logged, "line=\"unterminated\"\n"));
    assert_true(strstr(logged, "no \\\"driver") < strstr(logged, "line two"));
    for (char *l = logged; *l; l = strchr(l, '\n') + 1) {
        assert_memory_equal(l, "ts=", 3);
    }
    command_dispose(&c);
}

static void test_killed_by_a_signal(void **state)
{
    struct command c;
    command_init(&c);
    char *argv[4];
    struct command_spec spec = sh("kill -SEGV $$", argv);
    assert_int_equal(command_run(&c, &spec), -1);
    assert_int_equal(c.end, COMMAND_SIGNALED);
    assert_int_equal(c.code, SIGSEGV);
    char how[200];
    command_end_fields(&c, how, sizeof how);
    assert_string_equal(how, "how=\"was killed by signal SIGSEGV (11)\" signal=SIGSEGV "
                             "signal_number=11");
    command_dispose(&c);
}

/* The test process adopts orphans (a subreaper), so a grandchild the
 * deadline killed is reaped here and its end seen; unless the shell, killed
 * in the same instant, reaped it first (ECHILD): then it is gone. */
static void assert_killed(pid_t pid)
{
    int status = 0;
    uint64_t until = clock_now_ms() + 3000;
    pid_t w;
    while ((w = waitpid(pid, &status, WNOHANG)) == 0 && clock_now_ms() < until) {
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (w < 0 && errno == ECHILD) {
        assert_true(kill(pid, 0) < 0 && errno == ESRCH);
        return;
    }
    assert_int_equal(w, pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

static void test_deadline_kills_the_whole_group(void **state)
{
    struct command c;
    command_init(&c);
    char *argv[4];
    struct command_spec spec = sh("sleep 30 & echo $!; wait", argv);
    spec.timeout_ms = 300;
    uint64_t t0 = clock_now_ms();
    assert_int_equal(command_run(&c, &spec), -1);
    assert_true(clock_now_ms() - t0 < 2000);
    assert_int_equal(c.end, COMMAND_TIMED_OUT);
    char how[200];
    command_end_fields(&c, how, sizeof how);
    assert_string_equal(how, "how=\"did not finish within 300 ms (its process group was "
                             "killed)\" timed_out=true timeout_ms=300");
    assert_killed((pid_t)atoi(output(&c)));
    command_dispose(&c);
}

static void test_too_much_output_and_not_found(void **state)
{
    struct command c;
    command_init(&c);
    char *argv[4];
    struct command_spec spec = sh("head -c 100000 /dev/zero; sleep 30", argv);
    spec.max_output = 1000;
    assert_int_equal(command_run(&c, &spec), -1);
    assert_int_equal(c.end, COMMAND_TOO_MUCH);
    char *none[] = {"/nonexistent/thaw-command", NULL};
    spec.argv = none;
    assert_int_equal(command_run(&c, &spec), -1);
    assert_int_equal(c.end, COMMAND_NOT_RUN);
    assert_int_equal(c.code, ENOENT);
    command_dispose(&c);
}

struct loop_run {
    struct event_base *base;
    struct command c;
    int done_calls;
    int ticks; /* the loop's own timer, while the command ran */
    struct event *tick;
};

static void on_done(struct command *c, void *ud)
{
    struct loop_run *r = ud;
    r->done_calls++;
    event_base_loopexit(r->base, NULL);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct loop_run *r = arg;
    r->ticks++;
}

static void loop_init(struct loop_run *r)
{
    memset(r, 0, sizeof *r);
    r->base = event_base_new();
    command_init(&r->c);
    r->tick = event_new(r->base, -1, EV_PERSIST, on_tick, r);
    struct timeval tv = {0, 20 * 1000};
    event_add(r->tick, &tv);
}

static void loop_dispose(struct loop_run *r)
{
    command_dispose(&r->c);
    event_free(r->tick);
    event_base_free(r->base);
}

static void test_on_the_loop(void **state)
{
    struct loop_run r;
    loop_init(&r);
    char *argv[4];
    struct command_spec spec = sh("echo hi; sleep 0.3; echo there", argv);
    assert_int_equal(command_start(&r.c, r.base, &spec, on_done, &r), 0);
    assert_true(command_busy(&r.c));
    event_base_dispatch(r.base);
    assert_int_equal(r.done_calls, 1);
    assert_false(command_busy(&r.c));
    assert_true(command_succeeded(&r.c));
    assert_string_equal(output(&r.c), "hi\nthere\n");
    assert_true(r.ticks >= 5); /* the loop turned while it ran */
    /* Again, past its deadline. */
    spec = sh("sleep 30", argv);
    spec.timeout_ms = 200;
    assert_int_equal(command_start(&r.c, r.base, &spec, on_done, &r), 0);
    event_base_dispatch(r.base);
    assert_int_equal(r.done_calls, 2);
    assert_int_equal(r.c.end, COMMAND_TIMED_OUT);
    loop_dispose(&r);
}

static void test_reaped_elsewhere(void **state)
{
    struct loop_run r;
    loop_init(&r);
    char *argv[4];
    struct command_spec spec = sh("echo x", argv);
    assert_int_equal(command_start(&r.c, r.base, &spec, on_done, &r), 0);
    /* As the process backend's SIGCHLD handler does: waitpid(-1). */
    int status;
    pid_t w;
    while ((w = waitpid(-1, &status, 0)) != r.c.pid) {
        assert_true(w > 0); /* an orphan an earlier test left to this subreaper */
    }
    event_base_dispatch(r.base);
    assert_int_equal(r.done_calls, 1);
    assert_int_equal(r.c.end, COMMAND_ENDED);
    assert_string_equal(output(&r.c), "x\n");
    loop_dispose(&r);
}

static void test_dispose_kills_a_run(void **state)
{
    struct loop_run r;
    loop_init(&r);
    char *argv[4];
    struct command_spec spec = sh("sleep 30 & echo $!; wait", argv);
    assert_int_equal(command_start(&r.c, r.base, &spec, on_done, &r), 0);
    pid_t pid = r.c.pid;
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    char pidbuf[32] = "";
    ssize_t n = read(r.c.out_fd, pidbuf, sizeof pidbuf - 1);
    assert_true(n > 0);
    loop_dispose(&r);
    assert_int_equal(r.done_calls, 0);
    assert_int_equal(waitpid(pid, NULL, WNOHANG), -1); /* reaped */
    assert_killed((pid_t)atoi(pidbuf));
}

int main(void)
{
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exit_status_output_and_stderr),
        cmocka_unit_test(test_killed_by_a_signal),
        cmocka_unit_test(test_deadline_kills_the_whole_group),
        cmocka_unit_test(test_too_much_output_and_not_found),
        cmocka_unit_test(test_on_the_loop),
        cmocka_unit_test(test_reaped_elsewhere),
        cmocka_unit_test(test_dispose_kills_a_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
