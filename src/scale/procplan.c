#include "thaw/procplan.h"

#include <stdio.h>
#include <string.h>

int procplan_gpu_pick(const struct gpu_slot *gpus, size_t n, unsigned need)
{
    struct gpu_need want = {.slices = need};
    return procplan_gpu_place(gpus, n, &want);
}

uint64_t procplan_restart_backoff_ms(unsigned failures)
{
    if (failures == 0) {
        return 0;
    }
    uint64_t d = 1000;
    for (unsigned i = 1; i < failures && d < 60000; i++) {
        d *= 2;
    }
    return d > 60000 ? 60000 : d;
}

unsigned procplan_mps_percentage(unsigned slices, unsigned total)
{
    if (total == 0) {
        return 100;
    }
    unsigned pct = (100 * slices + total - 1) / total;
    return pct > 100 ? 100 : pct < 1 ? 1 : pct;
}

static bool mig_fits(const struct gpu_slot *g, const struct gpu_need *need)
{
    return g->profile && strcmp(g->profile, need->profile) == 0 && g->used == 0;
}

static bool whole_fits(const struct gpu_slot *g, const struct gpu_need *need)
{
    if (g->profile || g->slices - g->used < need->slices) {
        return false;
    }
    return !g->memory_bytes || !need->memory_bytes ||
           (g->memory_used <= g->memory_bytes &&
            g->memory_bytes - g->memory_used >= need->memory_bytes);
}

int procplan_gpu_place(const struct gpu_slot *gpus, size_t n, const struct gpu_need *need)
{
    int best = -1;
    unsigned best_free = 0;
    for (size_t i = 0; i < n; i++) {
        const struct gpu_slot *g = &gpus[i];
        if (need->profile ? !mig_fits(g, need) : !whole_fits(g, need)) {
            continue;
        }
        unsigned free_slices = g->slices - g->used;
        if (best < 0 || free_slices < best_free) {
            best = (int)i;
            best_free = free_slices;
        }
    }
    return best;
}

/* "(UUID: X)" at the end of a line: X into out. */
static bool read_uuid(const char *line, size_t len, char *out, size_t outlen)
{
    const char *u = memmem(line, len, "(UUID: ", 7);
    if (!u) {
        return false;
    }
    u += 7;
    const char *end = memchr(u, ')', (size_t)(line + len - u));
    if (!end || end == u || (size_t)(end - u) >= outlen) {
        return false;
    }
    memcpy(out, u, (size_t)(end - u));
    out[end - u] = '\0';
    return true;
}

static bool parse_smi_line(const char *line, size_t len, int last_gpu, struct smi_device *d)
{
    char buf[512];
    if (len >= sizeof buf) {
        return false;
    }
    memcpy(buf, line, len);
    buf[len] = '\0';
    memset(d, 0, sizeof *d);
    int idx = 0, used = 0;
    if (sscanf(buf, "GPU %d: %n", &idx, &used) == 1 && used > 0) {
        const char *name = buf + used;
        const char *paren = strstr(name, " (UUID: ");
        size_t nlen = paren ? (size_t)(paren - name) : strlen(name);
        snprintf(d->name, sizeof d->name, "%.*s", (int)nlen, name);
        d->gpu = idx;
        return read_uuid(buf, len, d->uuid, sizeof d->uuid);
    }
    char profile[32];
    int dev = 0;
    if (last_gpu >= 0 && sscanf(buf, " MIG %31s Device %d:", profile, &dev) == 2) {
        d->gpu = last_gpu;
        d->mig = true;
        snprintf(d->profile, sizeof d->profile, "%s", profile);
        return read_uuid(buf, len, d->uuid, sizeof d->uuid) && strncmp(d->uuid, "MIG-", 4) == 0;
    }
    return false;
}

int procplan_parse_nvidia_smi(const char *text, struct smi_device *out, size_t max)
{
    size_t n = 0;
    int last_gpu = -1;
    size_t last_gpu_at = 0;
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        while (len && (p[len - 1] == '\r' || p[len - 1] == ' ')) {
            len--;
        }
        if (len > 0) {
            struct smi_device d;
            if (!parse_smi_line(p, len, last_gpu, &d)) {
                return -1;
            }
            if (n < max) {
                out[n] = d;
                if (d.mig && last_gpu_at < n) {
                    out[last_gpu_at].has_mig = true;
                } else if (!d.mig) {
                    last_gpu = d.gpu;
                    last_gpu_at = n;
                }
                n++;
            }
        }
        p = nl ? nl + 1 : p + len;
    }
    return (int)n;
}
