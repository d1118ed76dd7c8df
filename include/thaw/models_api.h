/* GET /v1/models and GET /v1/models/{id} on the proxy port, answered by thaw
 * from what it knows (the router's names and the fleet's models), in
 * OpenAI's list shape. Listing never wakes a model and never contacts a
 * replica, so a client that lists models first does not start them all. */
#ifndef THAW_MODELS_API_H
#define THAW_MODELS_API_H

#include <stdbool.h>
#include <stddef.h>

#include "thaw/buf.h"
#include "thaw/runtime.h"

/* {"object":"list","data":[...]}: every name and alias served, sorted, each
 * {"id","object":"model","created" (when thaw started),"owned_by" (the
 * model's namespace)} plus what a UI shows: "root"
 * (the model an alias names), "state" (ready, starting, scaled_to_zero, unavailable),
 * "tier", "replicas" (ready now) and "queued". */
void models_api_list(const struct runtime *rt, struct buf *out);
/* One entry for the name or alias id; false (out untouched) when none. */
bool models_api_one(const struct runtime *rt, const char *id, size_t len, struct buf *out);

#endif
