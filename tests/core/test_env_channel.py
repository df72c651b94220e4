"""The env channel, default-deny: every name the node's GPU stack reads is refused unless
the policy's ``env.allowed`` admits it (docs/threat-model.md, "Environment").

The attacks come from the sources the threat model cites: the NVIDIA container toolkit's
gated modifiers, IMEX channels, driver capabilities and Jetson CSV mounts, HAMi-core's own
getenv calls, and MPS client variables. Each goes through ``review`` as a tenant would send
it (both webhooks on a CREATE); controls are what real workloads set.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

import pytest

from tests.core.test_bypass import (
    assert_clean,
    assert_refused,
    container,
    env_of,
    file_preload,
    gpu,
    pod,
    policy_with,
    review,
    sidecar,
    stored,
)
from tests.core.test_threats import config_map
from webhook.core.env import channel_of
from webhook.core.injection import LIBRARY_PATH
from webhook.core.policy import PolicyError

Obj = dict[str, Any]

WHOLE: Final = {"nvidia.com/gpu": 1}
MIG: Final = {"nvidia.com/mig-1g.10gb": 1}
MPS_SLICE: Final = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}


def env(name: str, value: str = "", **source: Any) -> Obj:
    if source:
        return {"name": name, "valueFrom": source}
    return {"name": name, "value": value}


def in_slice(*entries: Obj) -> Obj:
    return pod(gpu(env=entries))


def in_whole(*entries: Obj) -> Obj:
    return pod(container("main", limits=WHOLE, env=entries))


def in_plain(*entries: Obj) -> Obj:
    return pod(container("app", env=entries))


def in_sidecar_of_slice(*entries: Obj) -> Obj:
    return pod(gpu(), container("logger", env=entries))


# ---------------------------------------------------------------------- the toolkit's names

# Gated modifiers add device nodes to any container with a device list, with no privilege
# check (nvidia-container-toolkit internal/modifier/cdi.go:133-145 @d34b304).
GATES: Final = ("NVIDIA_GDS", "NVIDIA_MOFED", "NVIDIA_GDRCOPY", "NVIDIA_NVSWITCH")


@pytest.mark.parametrize("name", GATES)
@pytest.mark.parametrize("where", [in_slice, in_plain, in_sidecar_of_slice])
def test_gated_modifiers_outside_whole_gpus_are_refused(name: str, where: Any) -> None:
    assert_refused(review(where(env(name, "enabled"))), "raw-visible-devices")


@pytest.mark.parametrize("name", GATES)
def test_gated_modifiers_in_whole_gpu_containers_are_admitted(name: str) -> None:
    # GPUDirect Storage and RDMA, gdrcopy, NVSwitch: what a pod that owns its GPUs uses.
    assert review(in_whole(env(name, "enabled")))["allowed"]


@pytest.mark.parametrize(
    ("where", "value"),
    [
        *((w, v) for w in (in_slice, in_plain) for v in ("0", "0,1", "channelall")),
        *((in_whole, v) for v in ("all", "channelall", "0,all", "1, channelall", "0x1", "-1")),
        # A list names as many channels as it likes (every one, without "all"); another
        # number is a channel no device plugin handed out.
        *((in_whole, v) for v in ("0,1", "channel0,channel1", "7", "channel7")),
    ],
)
def test_imex_channels_beyond_numbered_ones_of_whole_gpus_are_refused(
    where: Any, value: str
) -> None:
    # cuda_image.go ImexChannelRequests: the channels become CDI devices mode=imex,id=N,
    # and pkg/nvcdi/lib-imex.go expands "channelall" to every channel of the node: the
    # boundary between tenants' NVLink memory.
    assert_refused(review(where(env("NVIDIA_IMEX_CHANNELS", value))), "raw-visible-devices")


@pytest.mark.parametrize("value", ["0", "channel0", " 0", "\t0", "0,channel0"])
def test_imex_channel_zero_of_whole_gpus_is_admitted(value: str) -> None:
    # GB200 multi-node NVLink jobs that own their GPUs: channel 0 is the one NVIDIA's
    # device plugin hands out (k8s-device-plugin api/config/v1/imex.go); lib-imex.go
    # getChannelIDs drops a "channel" prefix.
    assert review(in_whole(env("NVIDIA_IMEX_CHANNELS", value)))["allowed"]


def test_a_policy_opens_numbered_imex_channels_with_an_item_pattern() -> None:
    policy = policy_with(
        "  env:\n    allowed:\n"
        '      - {name: NVIDIA_IMEX_CHANNELS, itemPattern: "(channel)?[0-9]+", '
        "containers: [whole]}\n"
    )
    for value in ("3", "channel3, 4"):
        verdict = review(in_whole(env("NVIDIA_IMEX_CHANNELS", value)), policy)
        assert verdict["allowed"], (value, verdict["violations"])
    for value in ("channelall", "3,all"):
        verdict = review(in_whole(env("NVIDIA_IMEX_CHANNELS", value)), policy)
        assert_refused(verdict, "raw-visible-devices")


def test_a_slice_made_a_legacy_image_by_its_env_is_refused() -> None:
    # container_config.go: a legacy image gets every driver capability, graphics too.
    legacy = in_slice(env("CUDA_VERSION", "12.4"), env("NVIDIA_REQUIRE_CUDA", ""))
    assert_refused(review(legacy), "raw-visible-devices")
    required = in_slice(env("CUDA_VERSION", "12.4"), env("NVIDIA_REQUIRE_CUDA", "cuda>=12.4"))
    assert review(required)["allowed"]
    assert review(in_whole(env("CUDA_VERSION", "12.4")))["allowed"]
    # Without its own NVIDIA_REQUIRE_CUDA the image's decides, which admission cannot see.
    assert review(in_slice(env("CUDA_VERSION", "12.4")))["allowed"]


@pytest.mark.parametrize("value", ["graphics", "compute,display", "all", "compute,utility,ngx"])
def test_driver_capabilities_beyond_compute_in_a_slice_are_refused(value: str) -> None:
    # graphics/display bring the DRM nodes and a GL/Vulkan path HAMi-core does not meter.
    verdict = review(in_slice(env("NVIDIA_DRIVER_CAPABILITIES", value)))
    assert_refused(verdict, "raw-visible-devices")


@pytest.mark.parametrize(
    "value", ["compute,utility", "compute,utility,video", "utility", " compute , utility", ""]
)
def test_driver_capabilities_real_workloads_set_are_admitted(value: str) -> None:
    for where in (in_slice, in_whole, in_plain):
        verdict = review(where(env("NVIDIA_DRIVER_CAPABILITIES", value)))
        assert verdict["allowed"], (where.__name__, verdict["violations"])


def test_graphics_in_a_whole_gpu_container_is_admitted() -> None:
    verdict = review(in_whole(env("NVIDIA_DRIVER_CAPABILITIES", "all")))
    assert verdict["allowed"], verdict["violations"]


def test_driver_capabilities_from_value_from_in_a_slice_are_refused() -> None:
    entry = env("NVIDIA_DRIVER_CAPABILITIES", configMapKeyRef={"name": "caps", "key": "caps"})
    assert_refused(review(in_slice(entry)), "raw-visible-devices")


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA_MIG_CONFIG_DEVICES",
        "NVIDIA_MIG_MONITOR_DEVICES",
        "NVIDIA_SOMETHING_NOBODY_LISTED",
        "DOCKER_RESOURCE_GPU",
    ],
)
@pytest.mark.parametrize("where", [in_slice, in_whole, in_plain])
def test_unlisted_toolkit_names_are_refused(name: str, where: Any) -> None:
    assert_refused(review(where(env(name, "all"))), "raw-visible-devices")


def test_jetson_csv_mounts_are_refused() -> None:
    # internal/modifier/csv.go: csv-mounts=all mounts every CSV-listed host file.
    verdict = review(in_whole(env("NVIDIA_REQUIRE_JETPACK", "csv-mounts=all")))
    assert_refused(verdict, "raw-visible-devices")


@pytest.mark.parametrize(
    "entry",
    [
        env("NVIDIA_REQUIRE_CUDA", "cuda>=12.4 brand=tesla,driver>=470,driver<471"),
        env("NVIDIA_DISABLE_REQUIRE", "true"),
        env("NVIDIA_API_KEY", secretKeyRef={"name": "ngc", "key": "NVIDIA_API_KEY"}),
        env("CUDA_VISIBLE_DEVICES", "0"),
        env("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
        env("CUDA_LAUNCH_BLOCKING", "1"),
        env("CUDA_MEMORY_FRACTION", "0.5"),
        env("NVIDIA_VISIBLE_DEVICES", "void"),
    ],
    ids=lambda e: e["name"],
)
def test_what_real_workloads_set_is_admitted(entry: Obj) -> None:
    for where in (in_slice, in_whole, in_plain):
        verdict = review(where(entry))
        assert verdict["allowed"], (where.__name__, verdict["violations"])


@pytest.mark.parametrize("kind", ["initContainers", "ephemeralContainers"])
def test_other_container_kinds_are_judged(kind: str) -> None:
    obj = in_slice()
    extra = container("helper", env=[env("NVIDIA_GDS", "enabled")])
    if kind == "initContainers":
        obj["spec"]["initContainers"] = [sidecar("helper", env=extra["env"])]
    else:
        obj["spec"]["ephemeralContainers"] = [extra]
    assert_refused(review(obj), "raw-visible-devices")


# ------------------------------------------------------------------- HAMi-core and MPS names


@pytest.mark.parametrize(
    "entry",
    [
        env("RECORD_KERNEL_INTERVAL", "100000"),
        env("CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING", "1"),
        env("CUDA_MPS_CLIENT_PRIORITY", "7"),
    ],
    ids=lambda e: e["name"],
)
def test_unlisted_limit_names_in_a_gpu_pod_are_refused(entry: Obj) -> None:
    assert_refused(review(in_slice(entry)), "limit-tampering")


def test_limit_names_in_a_plain_pod_are_nobodys() -> None:
    # HAMi-core is loaded only where a slice is: a pod without a GPU reads none of them.
    assert_clean(review(in_plain(env("RECORD_KERNEL_INTERVAL", "1"))))


def test_listed_hami_core_names_are_admitted() -> None:
    verdict = review(in_slice(env("LIBCUDA_LOG_LEVEL", "4"), env("CUDA_MPS_CLIENT_PRIORITY", "1")))
    assert verdict["allowed"], verdict["violations"]


# ----------------------------------------------------------------------------- the policy


def test_the_policy_opens_more() -> None:
    policy = policy_with(
        "  env:\n    allowed:\n"
        "      - {name: NVIDIA_GDS, containers: [slice, whole]}\n"
        "      - {name: NVIDIA_DRIVER_CAPABILITIES, items: [compute, utility, graphics]}\n"
    )
    verdict = review(in_slice(env("NVIDIA_GDS", "enabled")), policy)
    assert verdict["allowed"], verdict["violations"]
    verdict = review(in_slice(env("NVIDIA_DRIVER_CAPABILITIES", "graphics")), policy)
    assert verdict["allowed"], verdict["violations"]
    # What its list leaves out is closed again.
    assert_refused(review(in_whole(env("NVIDIA_MOFED", "enabled")), policy), "raw-visible-devices")


def test_an_allowance_for_an_unguarded_name_is_a_policy_error() -> None:
    with pytest.raises(Exception, match="NVIDA_GDS"):
        policy_with("  env:\n    allowed:\n      - {name: NVIDA_GDS}\n")


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("[0-9", "not a regular expression"),
        (".*", "'.' is not allowed"),
        ("[^a]+", "'^' is not allowed"),
        ("a,b", "',' is not allowed"),
        ("a b", "' ' is not allowed"),
        (r"\d+", "only \\. and \\- may be escaped"),
        ("(?=a)a", "only (?: groups"),
        ("(?i)a", "only (?: groups"),
    ],
)
def test_an_item_pattern_core_and_cel_could_read_apart_is_a_policy_error(
    pattern: str, reason: str
) -> None:
    # The in-apiserver policies match one RE2 expression over the whole comma list: a
    # pattern that matches a comma, a blank or a tab, or reads differently in RE2, would
    # judge a value otherwise than the core's split.
    with pytest.raises(PolicyError, match=re.escape(reason)):
        policy_with(
            "  env:\n    allowed:\n"
            f"      - {{name: NVIDIA_IMEX_CHANNELS, itemPattern: {json.dumps(pattern)}}}\n"
        )


def test_an_item_pattern_opens_items_beside_listed_ones() -> None:
    policy = policy_with(
        "  env:\n    allowed:\n"
        "      - name: NVIDIA_DRIVER_CAPABILITIES\n"
        "        items: [compute]\n"
        '        itemPattern: "util(ity)?|vid{1,2}eo"\n'
    )
    for value in ("compute, utility", "util,compute", "viddeo"):
        verdict = review(in_slice(env("NVIDIA_DRIVER_CAPABILITIES", value)), policy)
        assert verdict["allowed"], (value, verdict["violations"])
    for value in ("compute,graphics", "utilities", "compute,util ity"):
        verdict = review(in_slice(env("NVIDIA_DRIVER_CAPABILITIES", value)), policy)
        assert_refused(verdict, "raw-visible-devices")


def test_channels() -> None:
    assert channel_of("NVIDIA_GDS") == "devices"
    assert channel_of("DOCKER_RESOURCE_GPU") == "devices"
    assert channel_of("CUDA_VERSION") == "devices"
    assert channel_of("RECORD_KERNEL_INTERVAL") == "limits"
    assert channel_of("CUDA_MPS_PIPE_DIRECTORY") == "limits"
    assert channel_of("CUDA_VISIBLE_DEVICES") is None
    assert channel_of("PATH") is None


# ------------------------------------------------------------------ ConfigMaps and Secrets


@pytest.mark.parametrize("key", ["NVIDIA_GDS", "NVIDIA_IMEX_CHANNELS", "CUDA_MPS_LOG_DIRECTORY"])
def test_env_source_with_an_unlisted_name_is_refused(key: str) -> None:
    assert_refused(review(config_map({key: "enabled"})), "raw-visible-devices")


def test_env_source_with_a_value_outside_the_list_is_refused() -> None:
    verdict = review(config_map({"NVIDIA_DRIVER_CAPABILITIES": "graphics"}))
    assert_refused(verdict, "raw-visible-devices")


def test_env_sources_real_workloads_hold_are_admitted() -> None:
    assert_clean(review(config_map({"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"})))
    assert_clean(review(config_map({"NVIDIA_API_KEY": "nvapi-xyz"}, "Secret")))


def test_a_secrets_values_are_never_read() -> None:
    # Capabilities are judged by value, which a Secret's data hides: only names admitted
    # with any value pass in a Secret.
    verdict = review(config_map({"NVIDIA_DRIVER_CAPABILITIES": "compute"}, "Secret"))
    assert_refused(verdict, "raw-visible-devices")


@pytest.mark.parametrize("prefix", ["NVIDIA_VISIBLE_DEVICES", "DOCKER_", "CUDA_MPS_"])
def test_env_from_prefix_that_spells_a_guarded_family_is_refused(prefix: str) -> None:
    source = {"prefix": prefix, "configMapRef": {"name": "env"}}
    assert_refused(review(pod(gpu(envFrom=[source]))), "raw-visible-devices")


def test_env_of_is_unchanged_for_admitted_names() -> None:
    obj = in_whole(env("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"))
    assert env_of(review(obj)["object"])["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"


# --------------------------------------------------------------------- the device pins

PINS: Final = {
    "NVIDIA_GDS": "disabled",
    "NVIDIA_MOFED": "disabled",
    "NVIDIA_GDRCOPY": "disabled",
    "NVIDIA_NVSWITCH": "disabled",
    "NVIDIA_IMEX_CHANNELS": "void",
}


def test_a_slice_container_gets_every_device_pin() -> None:
    # An image baking NVIDIA_GDS=enabled loses to the pod's env (containerd's WithEnv).
    final = env_of(review(in_slice())["object"])
    assert {name: final.get(name) for name in PINS} == PINS


def test_the_pins_are_admitted_anywhere_and_idempotent() -> None:
    entry = review(in_slice())
    again = review(entry["object"])
    assert_clean(again)
    assert again["object"] == entry["object"]


@pytest.mark.parametrize("where", [in_whole, in_plain])
def test_no_pin_outside_slices(where: Any) -> None:
    final = env_of(review(where())["object"])
    assert not set(PINS) & set(final)


def test_a_value_the_user_set_is_judged_not_pinned_over() -> None:
    verdict = review(in_slice(env("NVIDIA_IMEX_CHANNELS", "void"), env("NVIDIA_GDS", "disabled")))
    assert verdict["allowed"], verdict["violations"]
    final = verdict["object"]["spec"]["containers"][0]["env"]
    assert [e["value"] for e in final if e["name"] == "NVIDIA_GDS"] == ["disabled"]


def test_a_gate_the_policy_opens_for_slices_is_not_pinned() -> None:
    policy = policy_with("  env:\n    allowed:\n      - {name: NVIDIA_GDS}\n")
    final = env_of(review(in_slice(), policy)["object"])
    assert "NVIDIA_GDS" not in final
    assert final["NVIDIA_MOFED"] == "disabled"


# ------------------------------------------------------------------ the MPS client's settings


MPS_SETTINGS_SET: Final = (
    ("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"),
    ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100"),
    ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=80G"),
)


@pytest.mark.parametrize(("name", "value"), MPS_SETTINGS_SET)
@pytest.mark.parametrize("where", [in_slice, in_whole])
def test_mps_client_settings_where_no_mps_slice_is_are_refused(
    where: Any, name: str, value: str
) -> None:
    # The toolkit mounts the host's /tmp/nvidia-mps into every GPU container where it
    # exists (internal/discover/ipc.go): a vGPU slice that points CUDA at it becomes a
    # client of the node's daemon, whose server process owns its allocations; a whole GPU
    # that another stack's MPS daemon shares leaves its limits by pointing elsewhere.
    assert_refused(review(where(env(name, value))), "limit-tampering")


@pytest.mark.parametrize(("name", "value"), MPS_SETTINGS_SET)
def test_mps_client_settings_of_an_mps_slice_are_overwritten(name: str, value: str) -> None:
    mps = pod(
        container("main", limits=MPS_SLICE, env=[env(name, value)]),
        annotations={"gpushare.io/mode": "mps"},
    )
    verdict = review(mps)
    assert verdict["allowed"], verdict["violations"]
    assert verdict["mode"] == "mps"


# ------------------------------------------------------------------ LD_PRELOAD


@pytest.mark.parametrize(
    ("user", "stored_value"),
    [
        ("/app/libmyhook.so", f"{LIBRARY_PATH}:/app/libmyhook.so"),
        (f"/app/a.so {LIBRARY_PATH}", f"{LIBRARY_PATH}:/app/a.so"),
        ("", LIBRARY_PATH),
    ],
)
def test_with_the_preload_as_a_file_a_users_ld_preload_comes_after_libvgpu(
    user: str, stored_value: str
) -> None:
    # glibc loads LD_PRELOAD's objects before /etc/ld.so.preload's (elf/rtld.c dl_main):
    # a library that defines cuMemAlloc_v2 or dlsym would be found before HAMi-core's.
    obj = stored(pod(gpu(env=[env("LD_PRELOAD", user)])), file_preload())
    assert env_of(obj)["LD_PRELOAD"] == stored_value


def test_with_the_preload_as_a_file_no_ld_preload_is_added() -> None:
    obj = stored(pod(gpu()), file_preload())
    assert "LD_PRELOAD" not in env_of(obj)
    # A ConfigMap's value is replaced by ours: it cannot be merged before the kubelet reads it.
    source = env("LD_PRELOAD", configMapKeyRef={"name": "libs", "key": "preload"})
    obj = stored(pod(gpu(env=[source])), file_preload())
    assert env_of(obj)["LD_PRELOAD"] == LIBRARY_PATH
