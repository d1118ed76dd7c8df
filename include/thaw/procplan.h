/* Pure decisions of the process backend, kept apart so they can be tested
 * with a fake clock: where a replica goes (GPU slices), how fast readiness
 * is probed, how restarts back off. How many replicas a model gets is the
 * autoscaler's and the warm pool's business (scaler.h). */
#ifndef THAW_PROCPLAN_H
#define THAW_PROCPLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gpu_slot {
    int id;
    unsigned slices; /* replicas it takes (time-slicing replicas, MPS shares) */
    unsigned used;
};

/* The GPU for a replica needing `need` slices: the fullest one that still
 * fits it (packing leaves whole GPUs for big replicas). -1 when none fits. */
int procplan_gpu_pick(const struct gpu_slot *gpus, size_t n, unsigned need);

/* Delay before the next start after `failures` consecutive failed starts:
 * 0 for none, then 1 s, 2 s, 4 s ... capped at 60 s. */
uint64_t procplan_restart_backoff_ms(unsigned failures);

/* The MPS active-thread percentage for a replica using `slices` of `total`. */
unsigned procplan_mps_percentage(unsigned slices, unsigned total);

#endif
