/* Configuration reload (SIGHUP): reads the --config file again, validates it
 * whole, then applies the difference to the running server. A file that
 * does not load changes nothing. Models added are routed at once; removed
 * ones stop taking requests, answer their queue 503 model_removed and let
 * requests at their replicas finish; changed ones take their new settings,
 * and process replicas whose command changed are replaced after draining.
 * Models that did not change are not touched. Settings that need a restart
 * (listen addresses, gpus, autoscaler, warm_pool, kubernetes, tenants.source, a model's
 * backend kind) keep their running values and are logged. */
#ifndef THAW_RELOAD_H
#define THAW_RELOAD_H

#include <stdbool.h>
#include <stdint.h>

struct server;
struct config;
struct config_tenants;

/* Starts the reload status (the start-up load counts as the first success)
 * and handles SIGHUP from now on. Call after server_init. 0 or -1. */
int reload_install(struct server *srv);
/* Loads srv->cfg->path again and applies it; logs and counts the outcome. */
void reload_from_file(struct server *srv);
/* Applies next (validated) to the running server and takes it over. */
void reload_apply(struct server *srv, struct config *next);
/* A tenants document from tenants.source (backend_tenants_apply_fn, ud:
 * the server): applied as a reload applies the file's tenants (in-flight
 * and queued requests keep going under the new caps); takes ts's contents.
 * 0, or a negative errno with the tenants in force kept. */
int reload_apply_source_tenants(void *srv, struct config_tenants *ts);

#endif
