/* thaw: command line and wiring; the work is in the modules. */
#include "thaw/config.h"
#include "thaw/log.h"
#include "thaw/reload.h"
#include "thaw/server.h"
#include "thaw/tenant.h"

#include <getopt.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: thaw --config FILE [options]\n"
            "       thaw --check-config FILE\n"
            "       thaw hash-key < KEYFILE\n"
            "\n"
            "A scale-to-zero activator for GPU model servers.\n"
            "\n"
            "options:\n"
            "  -c, --config FILE          run with this configuration (JSON)\n"
            "      --check-config FILE    validate FILE and exit 0 (valid) or 1\n"
            "      --listen ADDR:PORT     proxy address (overrides \"listen\")\n"
            "      --admin-listen ADDR:PORT\n"
            "                             admin address (overrides \"admin_listen\")\n"
            "      --port-file FILE       write the bound addresses as JSON to FILE\n"
            "      --log-level LEVEL      debug, info, warn or error (overrides \"log.level\")\n"
            "      --kubeconfig FILE      Kubernetes credentials (else $KUBECONFIG, then\n"
            "                             kubernetes.kubeconfig, then in-cluster)\n"
            "  -h, --help                 show this help\n"
            "  -V, --version              show the version\n"
            "\n"
            "Port 0 in an address lets the kernel choose; --port-file tells which it chose.\n"
            "SIGTERM or SIGINT: stop accepting, finish in-flight requests (up to\n"
            "limits.drain_timeout_ms), exit 0.\n"
            "SIGHUP: reload the --config file; a file that does not load changes nothing.\n"
            "hash-key: reads an API key on standard input (one trailing newline is dropped)\n"
            "and prints the \"sha256:...\" form tenants.list[].api_keys takes.\n");
}

/* thaw hash-key: the key comes on stdin, not argv, so it stays out of shell
 * history and the process list. */
static int hash_key_main(void)
{
    char key[4097];
    size_t n = fread(key, 1, sizeof key, stdin);
    if (n == sizeof key) {
        fprintf(stderr, "thaw: hash-key: the key is longer than 4096 bytes\n");
        return 1;
    }
    if (n && key[n - 1] == '\n') {
        n--;
        if (n && key[n - 1] == '\r') {
            n--;
        }
    }
    if (n == 0) {
        fprintf(stderr, "thaw: hash-key: no key on standard input\n");
        return 1;
    }
    char out[80];
    tenant_format_digest(key, n, out, sizeof out);
    printf("%s\n", out);
    return 0;
}

/* Request bodies are buffered whole (up to limits.max_body_bytes). A fixed
 * mmap threshold puts every large buffer in its own mapping, returned to
 * the system when freed; glibc's default raises the threshold after the
 * first large free, so later large bodies land on the heap and the process
 * keeps their pages after they are gone. */
static void return_large_buffers_to_the_system(void)
{
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
    mallopt(M_TRIM_THRESHOLD, 1024 * 1024);
}

int main(int argc, char **argv)
{
    /* A reload asked for while starting (a service manager's reload right
     * after its start, while GPUs are discovered or a kubeconfig's plugin
     * runs) must neither end thaw (SIGHUP's default) nor be lost: it waits,
     * blocked, until the reload handler is in (children start with an empty
     * mask). */
    sigset_t hup;
    sigemptyset(&hup);
    sigaddset(&hup, SIGHUP);
    sigprocmask(SIG_BLOCK, &hup, NULL);
    return_large_buffers_to_the_system();
    if (argc == 2 && strcmp(argv[1], "hash-key") == 0) {
        return hash_key_main();
    }
    enum { OPT_CHECK = 1000, OPT_LISTEN, OPT_ADMIN, OPT_PORTFILE, OPT_LOGLEVEL, OPT_KUBECONFIG };
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"check-config", required_argument, NULL, OPT_CHECK},
        {"listen", required_argument, NULL, OPT_LISTEN},
        {"admin-listen", required_argument, NULL, OPT_ADMIN},
        {"port-file", required_argument, NULL, OPT_PORTFILE},
        {"log-level", required_argument, NULL, OPT_LOGLEVEL},
        {"kubeconfig", required_argument, NULL, OPT_KUBECONFIG},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    const char *config_path = NULL, *check_path = NULL, *listen = NULL, *admin = NULL;
    const char *port_file = NULL, *log_level = NULL, *kubeconfig = NULL;
    int opt;
    while ((opt = getopt_long(argc, argv, "c:hV", opts, NULL)) != -1) {
        switch (opt) {
        case 'c': config_path = optarg; break;
        case OPT_CHECK: check_path = optarg; break;
        case OPT_LISTEN: listen = optarg; break;
        case OPT_ADMIN: admin = optarg; break;
        case OPT_PORTFILE: port_file = optarg; break;
        case OPT_LOGLEVEL: log_level = optarg; break;
        case OPT_KUBECONFIG: kubeconfig = optarg; break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("thaw %s\n", THAW_VERSION); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "thaw: unexpected argument \"%s\"\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    struct config_error err;
    if (check_path) {
        struct config *cfg = config_load(check_path, &err);
        if (!cfg) {
            fprintf(stderr, "thaw: %s\n", err.msg);
            return 1;
        }
        printf("%s: ok (%zu models)\n", check_path, cfg->n_models);
        config_free(cfg);
        return 0;
    }
    if (!config_path) {
        fprintf(stderr, "thaw: --config FILE is required\n");
        usage(stderr);
        return 2;
    }
    struct config *cfg = config_load(config_path, &err);
    if (!cfg) {
        fprintf(stderr, "thaw: %s\n", err.msg);
        return 1;
    }
    if (log_level && log_level_parse(log_level, &cfg->log_level)) {
        fprintf(stderr, "thaw: --log-level: must be debug, info, warn or error\n");
        config_free(cfg);
        return 2;
    }
    if ((listen && config_set_listen(cfg, &cfg->listen, listen, "--listen", &err)) ||
        (admin && config_set_listen(cfg, &cfg->admin_listen, admin, "--admin-listen", &err))) {
        fprintf(stderr, "thaw: %s\n", err.msg);
        config_free(cfg);
        return 2;
    }
    log_init(cfg->log_level);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    struct server srv;
    int rc = server_init(&srv, cfg, port_file, kubeconfig);
    if (rc == 0) {
        rc = reload_install(&srv);
    }
    sigprocmask(SIG_UNBLOCK, &hup, NULL); /* a SIGHUP that came meanwhile: handled now */
    srv.rt.reload.listen_overridden = listen != NULL;
    srv.rt.reload.admin_listen_overridden = admin != NULL;
    srv.rt.reload.log_level_overridden = log_level != NULL;
    if (rc == 0) {
        rc = server_run(&srv);
    } else {
        rc = 1;
    }
    server_dispose(&srv);
    curl_global_cleanup();
    return rc;
}
