/* thaw-costsim: a day of traffic on shared GPUs, simulated second by second
 * under several policies (docs/performance.md, "Cost simulation").
 *
 *   trace.c          the traces: generators (fleet24, large, bursty-batch)
 *                    and the CSV form (read and write)
 *   sim.c            the cluster: replicas (pending, starting, ready,
 *                    draining), GPU slices, queues, dispatch, accounting
 *   policy_fixed.c   dedicated and static packing
 *   policy_knative.c Knative/KServe as it behaves by default
 *   policy_thaw.c    thaw's own autoscaler, warm pool and defaults
 *   report.c         the table, JSON lines and the SVG plot */
#ifndef THAW_COSTSIM_H
#define THAW_COSTSIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "thaw/autoscaler.h"
#include "thaw/tier.h"

#define CS_MAX_REPLICAS 16
#define CS_SLOTS 8  /* requests at once per replica (max_concurrency) */
#define CS_TICK_S 2 /* autoscaler and planner period */
#define CS_PLOT_STEP_S 300

/* ---- traces ---- */

struct cs_model {
    char name[48];
    enum tier tier;
    unsigned slices;     /* per replica */
    int cold_cached_s;   /* start with weights on the node */
    int cold_uncached_s; /* first start of the day: weights pulled */
};

struct cs_request {
    int t; /* arrival, seconds from the start */
    uint32_t model;
    uint8_t tier;
    uint32_t tokens; /* output tokens: the service time is cs_service_s() */
};

struct cs_trace {
    char name[32];
    uint64_t seed;
    int horizon; /* seconds */
    unsigned gpus, slices_per_gpu;
    struct cs_model *models;
    size_t n_models;
    struct cs_request *reqs; /* by time */
    size_t n_reqs, cap_reqs;
};

/* fleet24, large, bursty-batch; NULL when the name is unknown. */
extern const char *const cs_trace_names[];
int cs_trace_generate(struct cs_trace *tr, const char *name, uint64_t seed, double hours);
/* CSV: "time,model,tier,tokens" rows; "# box,GPUS,SLICES_PER_GPU" and
 * "# model,NAME,TIER,SLICES,COLD_CACHED_S,COLD_UNCACHED_S" comment lines
 * describe the box and the models (a model without one gets 1 slice and a
 * 7-8B model's cold starts). 0, or -1 with a message in err. */
int cs_trace_read(struct cs_trace *tr, FILE *f, const char *label, char *err, size_t errlen);
void cs_trace_write(const struct cs_trace *tr, FILE *f);
void cs_trace_free(struct cs_trace *tr);
/* Adds a model or a request (the trace grows). */
size_t cs_trace_add_model(struct cs_trace *tr, const char *name, enum tier t, unsigned slices,
                          int cold_cached_s, int cold_uncached_s);
void cs_trace_add_request(struct cs_trace *tr, int t, uint32_t model, enum tier tier,
                          uint32_t tokens);
void cs_trace_sort(struct cs_trace *tr);
/* Prefill and 40 tokens a second per stream, whole seconds, at least 1. */
int cs_service_s(uint32_t tokens);
unsigned cs_capacity(const struct cs_trace *tr);

/* ---- the simulated cluster ---- */

enum cs_rstate { R_NONE, R_PENDING, R_STARTING, R_READY, R_DRAINING };

struct cs_job {
    int arrived, service;
    uint8_t tier;
    bool met_slo; /* started within its tier's target */
};

struct cs_replica {
    enum cs_rstate st;
    int since;          /* created (pending) or placed */
    int ready_at;       /* starting: when it serves */
    int done[CS_SLOTS]; /* completion second per slot; 0: free */
    struct cs_job job[CS_SLOTS];
};

struct cs_jobq {
    struct cs_job *v;
    size_t head, len, cap;
};

struct cs_msim {
    const struct cs_model *spec;
    struct cs_replica r[CS_MAX_REPLICAS];
    struct cs_jobq q[TIER_COUNT];
    struct as_config asc;
    struct as_state ass;
    int last_used;
    double rate_ewma; /* requests per second, a minute's EWMA */
    unsigned arrivals_window;
    uint64_t arrivals; /* since the start */
    bool cold_waiting; /* a request arrived while no replica was ready */
    bool started_before; /* weights cached on the node */
    bool tiered;         /* dispatch by tier with aging (thaw) or FIFO */
};

struct cs_waits {
    float *v;
    size_t n, cap;
};

struct cs_result {
    double slice_hours[TIER_COUNT];
    /* A model's first replica got ready: with requests having waited for it
     * (a cold start) or with none (started ahead of demand); and the
     * requests that arrived while no replica of their model was ready. */
    unsigned cold_starts[TIER_COUNT], ahead_starts[TIER_COUNT];
    uint64_t cold_requests[TIER_COUNT];
    uint64_t served[TIER_COUNT], rejected[TIER_COUNT], failed[TIER_COUNT], slo_met[TIER_COUNT];
    uint64_t evictions, preemptions; /* replicas taken from another model */
    struct cs_waits waits[TIER_COUNT];
    double p50[TIER_COUNT], p99[TIER_COUNT];
    unsigned *plot[TIER_COUNT]; /* slices held per tier every CS_PLOT_STEP_S */
    size_t plot_n;
    unsigned warm_budget; /* thaw: the budget it ran with */
};

struct cs_sim;

struct cs_policy {
    const char *name;
    const char *models; /* one line: what it stands for */
    /* Once, before the first second. */
    void (*init)(struct cs_sim *s);
    /* Every CS_TICK_S, and at once when a request waits for a model at zero. */
    void (*plan)(struct cs_sim *s);
    /* Slices a replica of model i holds (whole GPUs for dedicated); NULL: its slices. */
    unsigned (*held_slices)(const struct cs_sim *s, size_t i);
    /* Frees what init allocated besides pstate itself; NULL: nothing. */
    void (*done)(struct cs_sim *s);
    bool unlimited; /* capacity is not the trace's box */
    bool tiered;    /* thaw's tiered queues */
};

struct cs_sim {
    const struct cs_trace *tr;
    const struct cs_policy *pol;
    struct cs_msim *m;
    size_t n;
    unsigned capacity; /* slices; 0: unlimited */
    unsigned held;     /* slices held by placed replicas */
    int t;
    int patience[TIER_COUNT]; /* a client gives up after this wait */
    struct cs_result *res;
    void *pstate; /* the policy's own */
};

/* What each tier's clients wait at most, and the SLO: a wait under target. */
extern const int cs_patience_s[TIER_COUNT];
extern const double cs_slo_target_s[TIER_COUNT];

/* Runs the policy over the trace; res is filled (cs_result_free after). */
void cs_run(const struct cs_policy *pol, const struct cs_trace *tr, struct cs_result *res);
void cs_result_free(struct cs_result *res);

/* For policies. Replicas of model i in any of the states in mask (bits 1 << R_*). */
#define CS_ACTIVE ((1u << R_PENDING) | (1u << R_STARTING) | (1u << R_READY))
unsigned cs_count(const struct cs_msim *m, unsigned mask);
unsigned cs_busy(const struct cs_msim *m);
size_t cs_queued(const struct cs_msim *m);
unsigned cs_free_slices(const struct cs_sim *s);
unsigned cs_slices_of(const struct cs_sim *s, size_t i);
/* Scales model i to n replicas: new ones wait pending for the scheduler;
 * going down removes pending ones first, then starting ones, then drains
 * the least busy ready ones (they finish what they hold, then free their
 * slices). */
void cs_scale_to(struct cs_sim *s, size_t i, unsigned n);
/* Kubernetes preemption: replica k of model i is deleted at once (its
 * in-flight requests fail) and its ReplicaSet creates a pending one. */
void cs_preempt(struct cs_sim *s, size_t i, size_t k);
/* Places pending replicas, highest priority (then oldest) first, where
 * slices are free; a replica that does not fit waits, others may pass. */
void cs_schedule(struct cs_sim *s);

extern const struct cs_policy cs_dedicated, cs_static, cs_knative, cs_thaw, cs_thaw_prewarm;
/* thaw's warm budget in slices; UINT_MAX (the default): thaw's own default. */
extern unsigned cs_thaw_warm_budget;

/* ---- report ---- */

struct cs_report_row {
    const struct cs_policy *pol;
    struct cs_result res;
};

void cs_report_table(FILE *f, const struct cs_trace *tr, const struct cs_report_row *rows, size_t n,
                     double price_per_gpu_hour);
void cs_report_json(FILE *f, const struct cs_trace *tr, const struct cs_report_row *rows, size_t n,
                    double price_per_gpu_hour);
int cs_report_svg(const char *path, const struct cs_trace *tr, const struct cs_result *res,
                  const char *title);

#endif
