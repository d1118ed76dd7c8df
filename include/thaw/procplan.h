/* Pure decisions of the process backend, kept apart so they can be tested
 * with a fake clock: where a replica goes (GPU slices), how fast readiness
 * is probed, how restarts back off. How many replicas a model gets is the
 * autoscaler's and the warm pool's business (scaler.h). */
#ifndef THAW_PROCPLAN_H
#define THAW_PROCPLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A unit of GPU capacity: a whole GPU shared by time-slicing or MPS, or one
 * MIG instance (a hardware partition: one replica, its own memory). */
struct gpu_slot {
    int id;              /* the physical GPU's index */
    unsigned slices;     /* replicas it takes (time-slicing replicas, MPS shares); 1 for MIG */
    unsigned used;
    const char *profile; /* a MIG instance's profile ("1g.10gb"); NULL: a whole GPU */
    uint64_t memory_bytes; /* framebuffer; 0: not declared (not limited) */
    uint64_t memory_used;
};

/* What a replica asks for: slices of a whole GPU (and optionally that much
 * of its memory), or one MIG instance of a profile. */
struct gpu_need {
    unsigned slices;
    uint64_t memory_bytes;
    const char *profile; /* non-NULL: a MIG instance of this profile */
};

/* Where a replica goes: for a MIG profile, a free instance of that profile;
 * else the fullest whole GPU that still has the slices and the memory
 * (packing leaves whole GPUs for big replicas; replicas whose memory would
 * sum above a GPU's never share it). -1 when none fits. */
int procplan_gpu_place(const struct gpu_slot *gpus, size_t n, const struct gpu_need *need);
/* The same for `need` slices and nothing else. */
int procplan_gpu_pick(const struct gpu_slot *gpus, size_t n, unsigned need);

/* One device in `nvidia-smi -L` output: a GPU, or a MIG instance of one. */
struct smi_device {
    int gpu;          /* the GPU's index */
    bool mig;         /* a MIG instance of that GPU */
    char profile[32]; /* MIG: "1g.10gb" */
    char uuid[96];    /* "GPU-..." or "MIG-..." */
    char name[96];    /* GPU: its product name */
    bool has_mig;     /* GPU: MIG instances follow it */
};

/* Parses `nvidia-smi -L` output (lines "GPU 0: NAME (UUID: GPU-...)" and,
 * under a GPU in MIG mode, "  MIG 1g.10gb Device 0: (UUID: MIG-...)").
 * Fills at most max devices in order; returns how many, or -1 when a line
 * is neither (the output is not what nvidia-smi prints). */
int procplan_parse_nvidia_smi(const char *text, struct smi_device *out, size_t max);

/* Delay before the next start after `failures` consecutive failed starts:
 * 0 for none, then 1 s, 2 s, 4 s ... capped at 60 s. */
uint64_t procplan_restart_backoff_ms(unsigned failures);

/* The MPS active-thread percentage for a replica using `slices` of `total`. */
unsigned procplan_mps_percentage(unsigned slices, unsigned total);

#endif
