/* Process backend decisions: placement on GPU slices, probe pacing,
 * restart backoff, MPS shares. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "thaw/procplan.h"
#include "thaw/probe.h"

static void test_gpu_pick_packs_and_refuses(void **state)
{
    struct gpu_slot g[3] = {{.id = 0, .slices = 4}, {.id = 1, .slices = 4, .used = 3},
                            {.id = 2, .slices = 2}};
    assert_int_equal(procplan_gpu_pick(g, 3, 1), 1); /* the fullest that fits */
    assert_int_equal(procplan_gpu_pick(g, 3, 2), 2);
    assert_int_equal(procplan_gpu_pick(g, 3, 3), 0);
    assert_int_equal(procplan_gpu_pick(g, 3, 5), -1);
    g[0].used = 4;
    g[1].used = 4;
    g[2].used = 1;
    assert_int_equal(procplan_gpu_pick(g, 3, 1), 2);
    assert_int_equal(procplan_gpu_pick(g, 3, 2), -1);
    assert_int_equal(procplan_gpu_pick(g, 0, 1), -1);
}

/* A machine with one A100 split into MIG instances of two profiles and two
 * time-sliced GPUs with 24 GB each. */
static void test_gpu_place_mig_profiles_and_memory(void **state)
{
    const uint64_t GB = 1000000000ull;
    struct gpu_slot g[5] = {
        {.id = 0, .slices = 1, .profile = "3g.20gb"},
        {.id = 0, .slices = 1, .profile = "1g.5gb"},
        {.id = 0, .slices = 1, .profile = "1g.5gb"},
        {.id = 1, .slices = 4, .memory_bytes = 24 * GB},
        {.id = 2, .slices = 4, .memory_bytes = 24 * GB},
    };
    struct gpu_need small = {.profile = "1g.5gb"};
    assert_int_equal(procplan_gpu_place(g, 5, &small), 1);
    g[1].used = 1;
    assert_int_equal(procplan_gpu_place(g, 5, &small), 2);
    g[2].used = 1;
    assert_int_equal(procplan_gpu_place(g, 5, &small), -1); /* the 3g one is not a 1g */
    struct gpu_need none = {.profile = "7g.40gb"};
    assert_int_equal(procplan_gpu_place(g, 5, &none), -1);
    /* Slices never land on a MIG instance. */
    struct gpu_need slice = {.slices = 1};
    assert_int_equal(procplan_gpu_place(g, 5, &slice), 3);
    /* Memory-bound packing: two 10 GB replicas share GPU 1, a third does
     * not fit there (30 > 24) although it has slices left: GPU 2. */
    struct gpu_need ten = {.slices = 1, .memory_bytes = 10 * GB};
    assert_int_equal(procplan_gpu_place(g, 5, &ten), 3);
    g[3].used = 1;
    g[3].memory_used = 10 * GB;
    assert_int_equal(procplan_gpu_place(g, 5, &ten), 3);
    g[3].used = 2;
    g[3].memory_used = 20 * GB;
    assert_int_equal(procplan_gpu_place(g, 5, &ten), 4);
    g[4].used = 2;
    g[4].memory_used = 20 * GB;
    assert_int_equal(procplan_gpu_place(g, 5, &ten), -1);
    /* Without a declared need, memory does not limit. */
    assert_int_equal(procplan_gpu_place(g, 5, &slice), 3);
}

static void test_nvidia_smi_list_is_parsed(void **state)
{
    /* As printed by recent drivers: one GPU in MIG mode, one not. */
    const char *out =
        "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5f0d2f6a-7c0e-1a2b-9d3e-111111111111)\n"
        "  MIG 3g.20gb     Device  0: (UUID: MIG-4c5f0a12-aaaa-5b6c-8d9e-222222222222)\n"
        "  MIG 1g.5gb      Device  1: (UUID: MIG-8a7b6c5d-bbbb-5e4f-9a8b-333333333333)\n"
        "  MIG 1g.5gb      Device  2: (UUID: MIG-1f2e3d4c-cccc-5b6a-8978-444444444444)\n"
        "GPU 1: NVIDIA L4 (UUID: GPU-9e8d7c6b-dddd-4a3b-2c1d-555555555555)\n";
    struct smi_device d[8];
    assert_int_equal(procplan_parse_nvidia_smi(out, d, 8), 5);
    assert_int_equal(d[0].gpu, 0);
    assert_false(d[0].mig);
    assert_true(d[0].has_mig);
    assert_string_equal(d[0].name, "NVIDIA A100-SXM4-40GB");
    assert_true(d[1].mig);
    assert_int_equal(d[1].gpu, 0);
    assert_string_equal(d[1].profile, "3g.20gb");
    assert_string_equal(d[1].uuid, "MIG-4c5f0a12-aaaa-5b6c-8d9e-222222222222");
    assert_string_equal(d[3].profile, "1g.5gb");
    assert_int_equal(d[4].gpu, 1);
    assert_false(d[4].has_mig);
    assert_string_equal(d[4].uuid, "GPU-9e8d7c6b-dddd-4a3b-2c1d-555555555555");
    /* Older drivers name MIG devices after their GPU. */
    const char *old =
        "GPU 0: A100-SXM4-40GB (UUID: GPU-e86cb44c-6756-fd30-cd4a-1e6da3caf9b0)\n"
        "  MIG 7g.40gb Device 0: (UUID: MIG-GPU-e86cb44c-6756-fd30-cd4a-1e6da3caf9b0/0/0)\n";
    assert_int_equal(procplan_parse_nvidia_smi(old, d, 8), 2);
    assert_string_equal(d[1].uuid, "MIG-GPU-e86cb44c-6756-fd30-cd4a-1e6da3caf9b0/0/0");
    /* Not nvidia-smi -L output (an error message): refused. */
    assert_int_equal(procplan_parse_nvidia_smi("NVIDIA-SMI has failed because it couldn't "
                                               "communicate with the NVIDIA driver.\n", d, 8), -1);
    assert_int_equal(procplan_parse_nvidia_smi("", d, 8), 0);
    /* A MIG line before any GPU line is not valid. */
    assert_int_equal(procplan_parse_nvidia_smi("  MIG 1g.5gb Device 0: (UUID: MIG-x)\n", d, 8),
                     -1);
}

static void test_probe_delay_is_fast_then_capped(void **state)
{
    assert_int_equal(probe_delay_ms(0), 2);
    assert_int_equal(probe_delay_ms(1), 4);
    assert_int_equal(probe_delay_ms(2), 8);
    assert_int_equal(probe_delay_ms(3), 16);
    assert_int_equal(probe_delay_ms(4), 20);
    assert_int_equal(probe_delay_ms(1000), 20);
    /* A 5-minute load: probes stay near 50 per second. */
    uint64_t t = 0;
    unsigned probes = 0;
    while (t < 300000) {
        t += probe_delay_ms(probes++);
    }
    assert_in_range(probes, 14000, 15100);
}

static void test_probe_pacing_refused_and_by_history(void **state)
{
    /* A closed port is probed tightly: 1, 2, 4, 4 ms. */
    assert_int_equal(probe_next_delay_ms(0, true, 0, 0), 1);
    assert_int_equal(probe_next_delay_ms(1, true, 0, 0), 2);
    assert_int_equal(probe_next_delay_ms(2, true, 0, 0), 4);
    assert_int_equal(probe_next_delay_ms(50, true, 0, 0), 4);
    /* An answer other than 2xx, no history: the 2..20 ms schedule. */
    assert_int_equal(probe_next_delay_ms(0, false, 0, 0), 2);
    assert_int_equal(probe_next_delay_ms(9, false, 0, 0), 20);
    /* A model that took 60 s last time: slow early (an eighth of what is
     * left, at most 250 ms), tight from 80% of the expected time on. */
    assert_int_equal(probe_next_delay_ms(3, true, 0, 60000), 250);
    assert_int_equal(probe_next_delay_ms(3, false, 47000, 60000), 250);
    assert_int_equal(probe_next_delay_ms(3, true, 48000, 60000), 4);
    assert_int_equal(probe_next_delay_ms(3, false, 70000, 60000), 16);
    /* Near the end of a short expected time the eighth is small: tight. */
    assert_int_equal(probe_next_delay_ms(0, true, 100, 200), 1);
    /* A 10-minute load expected at 10 minutes: a bare-connect probe every
     * 250 ms for the first 8 minutes, then at most every 4 ms. */
    uint64_t t = 0;
    unsigned probes = 0;
    while (t < 480000) {
        t += probe_next_delay_ms(probes++, true, t, 600000);
    }
    assert_in_range(probes, 1900, 2000);
}

static void test_restart_backoff(void **state)
{
    assert_int_equal(procplan_restart_backoff_ms(0), 0);
    assert_int_equal(procplan_restart_backoff_ms(1), 1000);
    assert_int_equal(procplan_restart_backoff_ms(2), 2000);
    assert_int_equal(procplan_restart_backoff_ms(4), 8000);
    assert_int_equal(procplan_restart_backoff_ms(7), 60000);
    assert_int_equal(procplan_restart_backoff_ms(100), 60000);
}

static void test_mps_share(void **state)
{
    assert_int_equal(procplan_mps_percentage(1, 4), 25);
    assert_int_equal(procplan_mps_percentage(3, 4), 75);
    assert_int_equal(procplan_mps_percentage(1, 3), 34);
    assert_int_equal(procplan_mps_percentage(4, 4), 100);
    assert_int_equal(procplan_mps_percentage(1, 0), 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_pick_packs_and_refuses),
        cmocka_unit_test(test_gpu_place_mig_profiles_and_memory),
        cmocka_unit_test(test_nvidia_smi_list_is_parsed),
        cmocka_unit_test(test_probe_delay_is_fast_then_capped),
        cmocka_unit_test(test_probe_pacing_refused_and_by_history),
        cmocka_unit_test(test_restart_backoff),
        cmocka_unit_test(test_mps_share),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
