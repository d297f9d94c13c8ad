/*
 * A mock libnvidia-ml.so.1 for labs and CI: NVML's C ABI (its struct layouts, versioned symbols and
 * error codes) answering from a state file, so that the real nvidia-ml-py bindings, and any other
 * NVML client, run unchanged on a machine without a GPU. TEST DOUBLE: nothing here talks to hardware.
 *
 * One source of truth: the state file is written from a simulated-GPU spec by the spec reader
 * (plugins/module_utils/_simulated_spec.py, mock_nvml_state_text; tests/mock_nvml/nvml_state.py writes
 * it), MIG profiles and placements per product included. This library parses only that line format,
 * never YAML.
 *
 * Where the state is: $GPUOPS_MOCK_NVML_STATE, else gpuops-mock-nvml.state in the directory this
 * library was loaded from (so a driver root mounted elsewhere still finds its own state).
 * The state is re-read whenever the file changes (checked on every call, and every 20 ms while
 * nvmlEventSetWait waits): a GPU whose `xid` changes delivers an XID event to the event sets that
 * registered for it; a GPU that becomes `lost` answers NVML_ERROR_GPU_IS_LOST.
 *
 * MIG layouts are the driver's state, shared by every process on the node: what clients change (MIG
 * mode, GPU and compute instances) is kept in a layout file beside the state (docs/mock-nvml.md), replaced
 * atomically under a lock and re-read like the state. A GPU's layout there holds while the spec declares
 * the same MIG layout for it; a spec that declares another one puts that in place.
 *
 * Test knobs (never set on a node): $GPUOPS_MOCK_NVML_FAIL="fnA:code,fnB:code@N" makes those
 * functions return that NVML error (every call, or only the Nth of this process); $GPUOPS_MOCK_NVML_TRACE=FILE
 * appends each function's name to FILE as it is called; $GPUOPS_MOCK_NVML_PLACEMENT=lowest puts a GPU instance
 * created without a placement on the lowest free one (another driver's policy); gpuopsMockNvmlResetGpu resets a GPU (what
 * `nvidia-smi --gpu-reset` does), which applies a pending MIG mode.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- NVML's types and constants (the values of nvml.h) --------------------------------------- */
typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_NOT_READY = 27,
    NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_UNKNOWN = 999,
};

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_NVLINK_MAX_LINKS 18
#define NVML_TOPOLOGY_SINGLE 10
#define NVML_TOPOLOGY_HOSTBRIDGE 30
#define NVML_TOPOLOGY_NODE 40
#define NVML_TOPOLOGY_SYSTEM 50
#define NVML_EVENT_TYPE_XID_CRITICAL_ERROR 0x8ULL
#define NVML_EVENT_TYPE_SINGLE_BIT_ECC 0x1ULL
#define NVML_EVENT_TYPE_DOUBLE_BIT_ECC 0x2ULL
#define NVML_EVENT_TYPE_PSTATE 0x4ULL
#define NVML_EVENT_TYPE_CLOCK 0x10ULL
#define NVML_SUPPORTED_EVENTS (NVML_EVENT_TYPE_SINGLE_BIT_ECC | NVML_EVENT_TYPE_DOUBLE_BIT_ECC | \
                               NVML_EVENT_TYPE_PSTATE | NVML_EVENT_TYPE_XID_CRITICAL_ERROR | NVML_EVENT_TYPE_CLOCK)

typedef struct {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount;
    unsigned int sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

/* ---- the state ---------------------------------------------------------------------------------- */
#define MAX_GPUS 64
#define MAX_LINKS NVML_NVLINK_MAX_LINKS
#define TEXT 96
#define UUID_TEXT 64
#define NAME_TEXT 32
/* MIG: NVML's profile enumerations, and what one GPU can hold (GPU-instance IDs 0-14 on 8 memory slices). */
#define GI_PROFILES 0x12 /* NVML_GPU_INSTANCE_PROFILE_COUNT */
#define CI_PROFILES 0x9  /* NVML_COMPUTE_INSTANCE_PROFILE_COUNT */
#define MAX_GI 15
#define MAX_CI 8
#define MAX_STARTS 8
#define MAX_MIG_DEVICES 7 /* nvmlDeviceGetMaxMigDeviceCount on the products modelled */

struct mock_device;
typedef struct mock_device *nvmlDevice_t;

/* A handle points at one of these; the first field tells a GPU from a MIG device. */
struct mock_device {
    int is_mig;
    int index;        /* the GPU's index (a MIG device: its parent's) */
    int gi, ci;       /* MIG: its GPU instance and compute instance */
};

/* A GPU- or compute-instance handle: where the instance lives (ci < 0 for a GPU instance). */
struct mock_instance {
    int gpu, gi, ci;
};

/* What a product offers (the state's gi_profile and ci_profile lines; the spec reader's tables). */
typedef struct {
    int offered;
    unsigned int id; /* NVIDIA's profile ID, e.g. 19 for 1g.10gb */
    char name[NAME_TEXT];
    unsigned int slices, instances, memory_slices, sm, ce, dec, enc, jpeg, ofa;
    unsigned long long memory_mib;
    int starts;
    unsigned int start[MAX_STARTS];
} mock_gi_profile_t;

typedef struct {
    int offered;
    unsigned int slices, instances, sm;
    int starts;
    unsigned int start[MAX_STARTS];
} mock_ci_profile_t;

/* A layout: the MIG mode and the instances in place. A handle's address never changes (slots by ID). */
typedef struct {
    int live;
    unsigned int profile, start, size; /* NVML_COMPUTE_INSTANCE_PROFILE_*, compute slices in its GI */
    unsigned long long memory_mib;
    char uuid[UUID_TEXT];
    char name[NAME_TEXT]; /* the profile as a MIG device names it: 1g.10gb, 1c.3g.40gb */
    struct mock_device handle;
    struct mock_instance instance;
} mock_ci_t;

typedef struct {
    int live;
    unsigned int profile, start, size; /* NVML_GPU_INSTANCE_PROFILE_*, memory slices */
    struct mock_instance instance;
    mock_ci_t ci[MAX_CI];
} mock_gi_t;

typedef struct {
    int current, pending;  /* NVML_DEVICE_MIG_DISABLE / _ENABLE */
    unsigned long serial;  /* compute instances created so far: a new one gets a new UUID */
    mock_gi_t gi[MAX_GI];  /* by GPU-instance ID */
} mock_mig_t;

/* A MIG device the spec declares: one compute instance in a GPU instance of its own, placed by the reader. */
typedef struct {
    char uuid[UUID_TEXT];
    unsigned long long memory_mib;
    char name[NAME_TEXT];
    unsigned int gi_profile, gi_start, ci_profile, ci_start;
} mock_declared_t;

typedef struct {
    struct mock_device handle;
    char uuid[TEXT], name[TEXT], serial[TEXT], bus_id[32], pcie_switch[32];
    unsigned int domain, bus, device, function, pci_device_id, pci_subsystem_id;
    unsigned long long memory_mib;
    int cc_major, cc_minor, numa_node, persistence, minor_number;
    int spec_persistence; /* the spec's persistence mode; `persistence` is the one in place */
    int mig_mode; /* the spec's: 0 disabled, 1 enabled, -1 unsupported */
    int architecture, brand;
    int lost;
    unsigned long long xid;
    unsigned long xid_generation; /* bumped whenever the xid value changes */
    int links, link_peer[MAX_LINKS];
    unsigned long cpu_affinity[4];
    unsigned int temperature_c, power_mw, power_limit_mw, util_gpu, util_memory;
    unsigned int clock_graphics, clock_sm, clock_memory, clock_video;
    unsigned long long ecc_corrected, ecc_uncorrected;
    unsigned int util_encoder, util_decoder, pcie_replays;
    unsigned int memory_temperature_c; /* 0: no memory sensor (NVML_FI_DEV_MEMORY_TEMP not supported) */
    unsigned long long energy_mj, memory_used_mib, memory_reserved_mib;
    unsigned int remapped_correctable, remapped_uncorrectable, remap_pending, remap_failure;
    /* NVLink data sent and received over all links (nvlink_counters): the spec's rates in KiB/s, and this process's
     * counters (KiB) at the instant the rates took effect here, in µs since the epoch (0: the epoch, counters 0). */
    unsigned long long nvlink_tx_rate, nvlink_rx_rate;
    long long nvlink_since_us;
    unsigned long long nvlink_tx_kib, nvlink_rx_kib;
    /* GPM's metrics between two samples (Hopper and newer): activity in %, PCIe traffic in MiB/s. */
    unsigned int gpm_graphics, gpm_tensor, gpm_dram;
    unsigned long long gpm_pcie_tx, gpm_pcie_rx;
    unsigned int memory_slices, compute_slices; /* 0: the product's MIG profiles are not modelled */
    mock_gi_profile_t gi_profile[GI_PROFILES];
    mock_ci_profile_t ci_profile[GI_PROFILES][CI_PROFILES];
    int declared_count;
    mock_declared_t declared[MAX_MIG_DEVICES];
    char mig_seed[40]; /* names the declared MIG layout */
    mock_mig_t mig;    /* the layout in place */
} mock_gpu_t;

typedef struct {
    int valid;
    char driver_version[80];
    int cuda_version;
    char nvml_version[80];
    /* the loaded kernel module's version where the spec gives one apart from the library's (driver_version) */
    char kernel_module_version[80];
    int count;
    mock_gpu_t gpu[MAX_GPUS];
} mock_state_t;

/* The layout file: per GPU that a client changed, the declaration it started from and its layout now. */
typedef struct {
    char uuid[UUID_TEXT];
    char seed[40];
    mock_mig_t mig;
} mock_layout_entry_t;

/* A GPU's persistence mode as a client set it (nvmlDeviceSetPersistenceMode), over the spec's. */
typedef struct {
    char uuid[TEXT];
    int mode;
} mock_persistence_t;

typedef struct {
    int count;
    mock_layout_entry_t entry[MAX_GPUS];
    int persistence_count;
    mock_persistence_t persistence[MAX_GPUS];
} mock_layout_t;

struct file_stamp {
    int exists;
    ino_t ino;
    off_t size;
    struct timespec mtime;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static mock_state_t state;
static mock_layout_t layout;
static int refcount;
static char state_path[PATH_MAX];
static char layout_path[PATH_MAX];
static struct file_stamp state_stamp, layout_stamp;
static int client_fd = -1; /* held, read-locked, while this process has NVML initialised */

/* ---- test knobs --------------------------------------------------------------------------------- */
static void trace(const char *name)
{
    const char *path = getenv("GPUOPS_MOCK_NVML_TRACE");
    if (path == NULL || *path == '\0')
        return;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    char line[128];
    int n = snprintf(line, sizeof line, "%s\n", name);
    if (n > 0 && write(fd, line, (size_t)n) < 0) {
        /* a trace is best effort */
    }
    close(fd);
}

/* How often this process called each function a failure is asked for (for "fn:code@N"). */
static pthread_mutex_t calls_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char name[64];
    unsigned long count;
} calls[32];

static unsigned long count_call(const char *name)
{
    pthread_mutex_lock(&calls_lock);
    unsigned long n = 0;
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        if (calls[i].name[0] == '\0')
            snprintf(calls[i].name, sizeof calls[i].name, "%s", name);
        if (strcmp(calls[i].name, name) == 0) {
            n = ++calls[i].count;
            break;
        }
    }
    pthread_mutex_unlock(&calls_lock);
    return n;
}

/* The NVML error a test asked this function to return, or NVML_SUCCESS: "fn:code" fails every call,
 * "fn:code@N" only the Nth call of this process (counted from 1), so a sequence can fail half-way. */
static nvmlReturn_t injected(const char *name)
{
    const char *spec = getenv("GPUOPS_MOCK_NVML_FAIL");
    if (spec == NULL)
        return NVML_SUCCESS;
    size_t len = strlen(name);
    for (const char *p = spec; *p;) {
        const char *end = strchr(p, ',');
        size_t item = end ? (size_t)(end - p) : strlen(p);
        if (item > len && strncmp(p, name, len) == 0 && p[len] == ':') {
            char *rest;
            long code = strtol(p + len + 1, &rest, 10);
            if (*rest != '@')
                return (nvmlReturn_t)code;
            unsigned long nth = strtoul(rest + 1, NULL, 10);
            return count_call(name) == nth ? (nvmlReturn_t)code : NVML_SUCCESS;
        }
        if (!end)
            break;
        p = end + 1;
    }
    return NVML_SUCCESS;
}

#define ENTER(name)                                  \
    do {                                             \
        trace(name);                                 \
        nvmlReturn_t injected_error = injected(name); \
        if (injected_error != NVML_SUCCESS)          \
            return injected_error;                   \
    } while (0)

/* ---- where the files are ------------------------------------------------------------------------ */
static void copy_text(char *dst, size_t size, const char *src)
{
    snprintf(dst, size, "%s", src);
}

/* The directory this library was loaded from, or "" when the loader does not say. */
static void library_dir(char *dir, size_t size)
{
    Dl_info info;
    dir[0] = '\0';
    if (dladdr((void *)library_dir, &info) && info.dli_fname) {
        snprintf(dir, size, "%s", info.dli_fname);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = '\0';
        else
            dir[0] = '\0';
    }
}

/* Follows symbolic links to the file a path names, which need not exist yet (relative links resolve from
 * the link's directory, so a driver root mounted elsewhere leads to its own files). */
static void resolve_links(char *path, size_t size)
{
    for (int hops = 0; hops < 8; hops++) {
        char target[PATH_MAX];
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n <= 0)
            return;
        target[n] = '\0';
        char *slash = target[0] == '/' ? NULL : strrchr(path, '/');
        size_t keep = slash ? (size_t)(slash - path) + 1 : 0; /* the link's directory, with its slash */
        if (keep + (size_t)n + 1 > size)
            return;
        memmove(path + keep, target, (size_t)n + 1);
    }
}

/* The state: $GPUOPS_MOCK_NVML_STATE, else beside the library. The MIG layout: $GPUOPS_MOCK_NVML_MIG_LAYOUT,
 * else beside the state named by the variable (STATE.mig), else beside the library. */
static void find_paths(void)
{
    const char *env = getenv("GPUOPS_MOCK_NVML_STATE");
    const char *mig = getenv("GPUOPS_MOCK_NVML_MIG_LAYOUT");
    char dir[PATH_MAX - 32];
    library_dir(dir, sizeof dir);
    if (env && *env)
        snprintf(state_path, sizeof state_path, "%s", env);
    else if (dir[0])
        snprintf(state_path, sizeof state_path, "%s/gpuops-mock-nvml.state", dir);
    else
        snprintf(state_path, sizeof state_path, "gpuops-mock-nvml.state");
    if (mig && *mig)
        snprintf(layout_path, sizeof layout_path, "%s", mig);
    else if (env && *env)
        snprintf(layout_path, sizeof layout_path, "%.*s.mig", PATH_MAX - 8, env);
    else if (dir[0])
        snprintf(layout_path, sizeof layout_path, "%s/gpuops-mock-nvml.mig", dir);
    else
        snprintf(layout_path, sizeof layout_path, "gpuops-mock-nvml.mig");
    resolve_links(layout_path, sizeof layout_path);
}

/* Whether the file changed since the stamp (a file that is gone counts as changed once); updates it. */
static int file_changed(const char *path, struct file_stamp *stamp)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        int changed = stamp->exists;
        memset(stamp, 0, sizeof *stamp);
        return changed;
    }
    int changed = !stamp->exists || st.st_ino != stamp->ino || st.st_size != stamp->size ||
                  st.st_mtim.tv_sec != stamp->mtime.tv_sec || st.st_mtim.tv_nsec != stamp->mtime.tv_nsec;
    stamp->exists = 1;
    stamp->ino = st.st_ino;
    stamp->size = st.st_size;
    stamp->mtime = st.st_mtim;
    return changed;
}

/* ---- reading the state file ------------------------------------------------------------------- */
static int parse_starts(const char *text, unsigned int *start)
{
    int n = 0;
    for (const char *p = text; *p && n < MAX_STARTS;) {
        char *end;
        start[n++] = (unsigned int)strtoul(p, &end, 10);
        if (*end != ',')
            break;
        p = end + 1;
    }
    return n;
}

static int parse_mig_line(mock_gpu_t *gpu, const char *key, const char *value)
{
    if (strcmp(key, "mig_slices") == 0) {
        return sscanf(value, "%u %u", &gpu->memory_slices, &gpu->compute_slices) == 2 ? 0 : -1;
    } else if (strcmp(key, "gi_profile") == 0) {
        /* gi_profile INDEX ID NAME SLICES INSTANCES MEMORY_MIB SMS CE DEC ENC JPEG OFA MEMORY_SLICES STARTS */
        unsigned int index;
        mock_gi_profile_t p = {0};
        char starts[64];
        if (sscanf(value, "%u %u %31s %u %u %llu %u %u %u %u %u %u %u %63s", &index, &p.id, p.name, &p.slices,
                   &p.instances, &p.memory_mib, &p.sm, &p.ce, &p.dec, &p.enc, &p.jpeg, &p.ofa, &p.memory_slices,
                   starts) != 14 ||
            index >= GI_PROFILES || p.memory_slices == 0)
            return -1;
        p.offered = 1;
        p.starts = parse_starts(starts, p.start);
        gpu->gi_profile[index] = p;
    } else if (strcmp(key, "ci_profile") == 0) {
        /* ci_profile GI_INDEX CI_INDEX SLICES INSTANCES SMS STARTS */
        unsigned int gi, ci;
        mock_ci_profile_t p = {0};
        char starts[64];
        if (sscanf(value, "%u %u %u %u %u %63s", &gi, &ci, &p.slices, &p.instances, &p.sm, starts) != 6 ||
            gi >= GI_PROFILES || ci >= CI_PROFILES)
            return -1;
        p.offered = 1;
        p.starts = parse_starts(starts, p.start);
        gpu->ci_profile[gi][ci] = p;
    } else if (strcmp(key, "mig") == 0) {
        /* mig UUID MEMORY_MIB PROFILE GI_INDEX GI_START CI_INDEX CI_START */
        if (gpu->declared_count >= MAX_MIG_DEVICES)
            return -1;
        mock_declared_t *d = &gpu->declared[gpu->declared_count];
        if (sscanf(value, "%63s %llu %31s %u %u %u %u", d->uuid, &d->memory_mib, d->name, &d->gi_profile,
                   &d->gi_start, &d->ci_profile, &d->ci_start) != 7 ||
            d->gi_profile >= GI_PROFILES || d->ci_profile >= CI_PROFILES)
            return -1;
        gpu->declared_count++;
    } else if (strcmp(key, "mig_seed") == 0) {
        copy_text(gpu->mig_seed, sizeof gpu->mig_seed, value);
    }
    return 0;
}

/* Only what a state holds is touched: a GPU's slot is cleared when its line opens it. */
static int parse_state(FILE *file, mock_state_t *out)
{
    memset(out, 0, offsetof(mock_state_t, gpu));
    char line[512];
    mock_gpu_t *gpu = NULL;
    int version_seen = 0;
    while (fgets(line, sizeof line, file)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '#' || line[0] == '\0')
            continue;
        char *value = strchr(line, ' ');
        if (value)
            *value++ = '\0';
        else
            value = line + strlen(line);
        const char *key = line;
        if (strcmp(key, "format") == 0) {
            version_seen = strcmp(value, "gpuops-mock-nvml 2") == 0;
        } else if (strcmp(key, "driver_version") == 0) {
            copy_text(out->driver_version, sizeof out->driver_version, value);
        } else if (strcmp(key, "nvml_version") == 0) {
            copy_text(out->nvml_version, sizeof out->nvml_version, value);
        } else if (strcmp(key, "kernel_module_version") == 0) {
            copy_text(out->kernel_module_version, sizeof out->kernel_module_version, value);
        } else if (strcmp(key, "cuda_driver_version") == 0) {
            out->cuda_version = atoi(value);
        } else if (strcmp(key, "gpu") == 0) {
            if (out->count >= MAX_GPUS)
                return -1;
            gpu = &out->gpu[out->count];
            memset(gpu, 0, sizeof *gpu);
            gpu->handle.index = out->count;
            gpu->mig_mode = 0;
            gpu->numa_node = -1;
            out->count++;
        } else if (gpu == NULL) {
            continue; /* a key this version does not know, before any GPU */
        } else if (strcmp(key, "uuid") == 0) {
            copy_text(gpu->uuid, sizeof gpu->uuid, value);
        } else if (strcmp(key, "name") == 0) {
            copy_text(gpu->name, sizeof gpu->name, value);
        } else if (strcmp(key, "serial") == 0) {
            copy_text(gpu->serial, sizeof gpu->serial, value);
        } else if (strcmp(key, "pci_bus_id") == 0) {
            copy_text(gpu->bus_id, sizeof gpu->bus_id, value);
            sscanf(value, "%x:%x:%x.%x", &gpu->domain, &gpu->bus, &gpu->device, &gpu->function);
        } else if (strcmp(key, "pci_device_id") == 0) {
            gpu->pci_device_id = (unsigned int)strtoul(value, NULL, 0);
        } else if (strcmp(key, "pci_subsystem_id") == 0) {
            gpu->pci_subsystem_id = (unsigned int)strtoul(value, NULL, 0);
        } else if (strcmp(key, "memory_mib") == 0) {
            gpu->memory_mib = strtoull(value, NULL, 10);
        } else if (strcmp(key, "compute_capability") == 0) {
            sscanf(value, "%d.%d", &gpu->cc_major, &gpu->cc_minor);
        } else if (strcmp(key, "numa_node") == 0) {
            gpu->numa_node = atoi(value);
        } else if (strcmp(key, "persistence_mode") == 0) {
            gpu->persistence = gpu->spec_persistence = atoi(value);
        } else if (strcmp(key, "minor_number") == 0) {
            gpu->minor_number = atoi(value);
        } else if (strcmp(key, "mig_mode") == 0) {
            gpu->mig_mode = strcmp(value, "enabled") == 0 ? 1 : strcmp(value, "unsupported") == 0 ? -1 : 0;
        } else if (strcmp(key, "architecture") == 0) {
            gpu->architecture = atoi(value);
        } else if (strcmp(key, "brand") == 0) {
            gpu->brand = atoi(value);
        } else if (strcmp(key, "pcie_switch") == 0) {
            copy_text(gpu->pcie_switch, sizeof gpu->pcie_switch, value);
        } else if (strcmp(key, "nvlink_peer") == 0) {
            if (gpu->links < MAX_LINKS)
                gpu->link_peer[gpu->links++] = atoi(value);
        } else if (strcmp(key, "xid") == 0) {
            gpu->xid = strtoull(value, NULL, 10);
        } else if (strcmp(key, "lost") == 0) {
            gpu->lost = atoi(value);
        } else if (strcmp(key, "cpu_affinity") == 0) {
            sscanf(value, "%lx %lx %lx %lx", &gpu->cpu_affinity[0], &gpu->cpu_affinity[1],
                   &gpu->cpu_affinity[2], &gpu->cpu_affinity[3]);
        } else if (strcmp(key, "temperature_c") == 0) {
            gpu->temperature_c = (unsigned int)atoi(value);
        } else if (strcmp(key, "power_mw") == 0) {
            sscanf(value, "%u %u", &gpu->power_mw, &gpu->power_limit_mw);
        } else if (strcmp(key, "utilization") == 0) {
            sscanf(value, "%u %u", &gpu->util_gpu, &gpu->util_memory);
        } else if (strcmp(key, "clocks_mhz") == 0) {
            sscanf(value, "%u %u %u %u", &gpu->clock_graphics, &gpu->clock_sm, &gpu->clock_memory,
                   &gpu->clock_video);
        } else if (strcmp(key, "ecc_errors") == 0) {
            sscanf(value, "%llu %llu", &gpu->ecc_corrected, &gpu->ecc_uncorrected);
        } else if (strcmp(key, "codec_utilization") == 0) {
            sscanf(value, "%u %u", &gpu->util_encoder, &gpu->util_decoder);
        } else if (strcmp(key, "energy_mj") == 0) {
            gpu->energy_mj = strtoull(value, NULL, 10);
        } else if (strcmp(key, "pcie_replays") == 0) {
            gpu->pcie_replays = (unsigned int)strtoul(value, NULL, 10);
        } else if (strcmp(key, "memory_use_mib") == 0) {
            sscanf(value, "%llu %llu", &gpu->memory_used_mib, &gpu->memory_reserved_mib);
        } else if (strcmp(key, "remapped_rows") == 0) {
            sscanf(value, "%u %u %u %u", &gpu->remapped_correctable, &gpu->remapped_uncorrectable,
                   &gpu->remap_pending, &gpu->remap_failure);
        } else if (strcmp(key, "memory_temperature_c") == 0) {
            gpu->memory_temperature_c = (unsigned int)atoi(value);
        } else if (strcmp(key, "nvlink_kib_per_s") == 0) {
            sscanf(value, "%llu %llu", &gpu->nvlink_tx_rate, &gpu->nvlink_rx_rate);
        } else if (strcmp(key, "gpm") == 0) {
            sscanf(value, "%u %u %u %llu %llu", &gpu->gpm_graphics, &gpu->gpm_tensor, &gpu->gpm_dram,
                   &gpu->gpm_pcie_tx, &gpu->gpm_pcie_rx);
        } else if (parse_mig_line(gpu, key, value) != 0) {
            return -1;
        }
    }
    return version_seen ? 0 : -1;
}

/* ---- the MIG layout ----------------------------------------------------------------------------- */
/* A GPU instance's ID follows from its placement, as NVIDIA's driver numbers them on 8 memory slices:
 * the whole GPU is 0, the halves 1-2, the quarters 3-6, the eighths 7-14. */
static int gi_id_of(const mock_gpu_t *gpu, unsigned int start, unsigned int size)
{
    if (size == 0 || gpu->memory_slices == 0 || gpu->memory_slices % size || start % size)
        return -1;
    int id = (int)(gpu->memory_slices / size - 1 + start / size);
    return id < MAX_GI ? id : -1;
}

/* The layout a GPU has when nothing changed it: the spec's MIG mode and declared MIG devices. */
static void seed_layout(const mock_gpu_t *gpu, mock_mig_t *mig)
{
    memset(mig, 0, sizeof *mig);
    mig->current = mig->pending = gpu->mig_mode == 1;
    for (int i = 0; mig->current && i < gpu->declared_count; i++) {
        const mock_declared_t *d = &gpu->declared[i];
        const mock_gi_profile_t *gp = &gpu->gi_profile[d->gi_profile];
        const mock_ci_profile_t *cp = &gpu->ci_profile[d->gi_profile][d->ci_profile];
        int id = gi_id_of(gpu, d->gi_start, gp->memory_slices);
        if (!gp->offered || !cp->offered || id < 0 || mig->gi[id].live)
            continue; /* the spec reader placed them; a state that says otherwise is not ours */
        mock_gi_t *gi = &mig->gi[id];
        gi->live = 1;
        gi->profile = d->gi_profile;
        gi->start = d->gi_start;
        gi->size = gp->memory_slices;
        mock_ci_t *ci = &gi->ci[0];
        ci->live = 1;
        ci->profile = d->ci_profile;
        ci->start = d->ci_start;
        ci->size = cp->slices;
        ci->memory_mib = d->memory_mib;
        copy_text(ci->uuid, sizeof ci->uuid, d->uuid);
        copy_text(ci->name, sizeof ci->name, d->name);
    }
}

/* Points every slot's handles at itself: a handle is the slot's address, checked against these. */
static void set_handles(mock_gpu_t *gpu)
{
    for (int g = 0; g < MAX_GI; g++) {
        mock_gi_t *gi = &gpu->mig.gi[g];
        gi->instance = (struct mock_instance){gpu->handle.index, g, -1};
        for (int c = 0; c < MAX_CI; c++) {
            gi->ci[c].instance = (struct mock_instance){gpu->handle.index, g, c};
            gi->ci[c].handle = (struct mock_device){1, gpu->handle.index, g, c};
        }
    }
}

static mock_layout_entry_t *layout_entry(mock_layout_t *from, const char *uuid)
{
    for (int i = 0; i < from->count; i++)
        if (strcmp(from->entry[i].uuid, uuid) == 0)
            return &from->entry[i];
    return NULL;
}

/* Each GPU's layout in place: the one the layout file keeps for it while the spec still declares what that
 * started from, else the declared one. */
static void merge_layouts(void)
{
    for (int i = 0; i < state.count; i++) {
        mock_gpu_t *gpu = &state.gpu[i];
        const mock_layout_entry_t *kept = layout_entry(&layout, gpu->uuid);
        if (kept && gpu->mig_mode >= 0 && strcmp(kept->seed, gpu->mig_seed) == 0)
            gpu->mig = kept->mig;
        else
            seed_layout(gpu, &gpu->mig);
        set_handles(gpu);
        gpu->persistence = gpu->spec_persistence;
        for (int p = 0; p < layout.persistence_count; p++)
            if (strcmp(layout.persistence[p].uuid, gpu->uuid) == 0)
                gpu->persistence = layout.persistence[p].mode;
    }
}

/* layout file: "format gpuops-mock-nvml-mig 1", then per GPU
 *   gpu UUID SEED CURRENT PENDING SERIAL
 *   gi ID PROFILE START SIZE
 *   ci GI_ID CI_ID PROFILE START SIZE MEMORY_MIB UUID NAME
 * and per GPU whose persistence mode a client set
 *   persistence UUID MODE                                                                                  */
static int parse_layout(FILE *file, mock_layout_t *out)
{
    out->count = 0;
    out->persistence_count = 0;
    char line[512];
    mock_layout_entry_t *entry = NULL;
    int version_seen = 0;
    while (fgets(line, sizeof line, file)) {
        line[strcspn(line, "\r\n")] = '\0';
        unsigned int g, c, profile, start, size;
        if (line[0] == '#' || line[0] == '\0') {
            continue;
        } else if (strcmp(line, "format gpuops-mock-nvml-mig 1") == 0) {
            version_seen = 1;
        } else if (strncmp(line, "persistence ", 12) == 0) {
            if (out->persistence_count >= MAX_GPUS)
                return -1;
            mock_persistence_t *kept = &out->persistence[out->persistence_count++];
            if (sscanf(line + 12, "%95s %d", kept->uuid, &kept->mode) != 2 || (kept->mode != 0 && kept->mode != 1))
                return -1;
        } else if (strncmp(line, "gpu ", 4) == 0) {
            if (out->count >= MAX_GPUS)
                return -1;
            entry = &out->entry[out->count++];
            memset(entry, 0, sizeof *entry);
            if (sscanf(line + 4, "%63s %39s %d %d %lu", entry->uuid, entry->seed, &entry->mig.current,
                       &entry->mig.pending, &entry->mig.serial) != 5)
                return -1;
        } else if (entry && sscanf(line, "gi %u %u %u %u", &g, &profile, &start, &size) == 4 && g < MAX_GI &&
                   profile < GI_PROFILES) {
            entry->mig.gi[g] = (mock_gi_t){.live = 1, .profile = profile, .start = start, .size = size};
        } else if (entry && strncmp(line, "ci ", 3) == 0) {
            mock_ci_t ci = {.live = 1};
            if (sscanf(line + 3, "%u %u %u %u %u %llu %63s %31s", &g, &c, &ci.profile, &ci.start, &ci.size,
                       &ci.memory_mib, ci.uuid, ci.name) != 8 ||
                g >= MAX_GI || c >= MAX_CI || !entry->mig.gi[g].live || ci.profile >= CI_PROFILES)
                return -1;
            entry->mig.gi[g].ci[c] = ci;
        } else {
            return -1;
        }
    }
    return version_seen ? 0 : -1;
}

static void read_layout(void)
{
    static mock_layout_t fresh;
    FILE *file = fopen(layout_path, "re");
    if (file == NULL) {
        layout.count = 0;
        layout.persistence_count = 0;
        return;
    }
    int parsed = parse_layout(file, &fresh);
    fclose(file);
    if (parsed == 0)
        memcpy(&layout, &fresh, sizeof layout);
}

/* NVLink traffic of all links (fields NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX and _RX): a counter in KiB per direction,
 * growing at the spec's rates (KiB/s) since they took effect. The instant a reading gives is the last one, at or
 * before now, at which both counters are whole KiB: a whole number of quanta after the rates took effect, a quantum
 * being the µs in which each rate grows by whole KiB (1 µs for idle links, 1 ms where both rates are multiples of
 * 1000 KiB/s, never more than 1 s). So two readings at the same rates differ by exactly the rates times the time
 * between them, and a client's KiB/s is the spec's to the unit, with no rounding to be off by one; two readings within
 * one quantum give the same instant. The counters start at 0 at the Unix epoch and run on across a change of the
 * rates, which take effect at the last whole-KiB instant before this process read them (refresh_locked): each
 * process's counters are continuous, and two processes' agree until the rates change while both run (a TEST
 * DOUBLE's simplification; NVML's are the driver's). */
static unsigned long long gcd_ull(unsigned long long a, unsigned long long b)
{
    while (b) {
        unsigned long long r = a % b;
        a = b;
        b = r;
    }
    return a;
}

static long long realtime_us(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (long long)now.tv_sec * 1000000 + now.tv_nsec / 1000;
}

static void nvlink_counters(const mock_gpu_t *gpu, long long now_us, long long *at, unsigned long long *tx,
                            unsigned long long *rx)
{
    /* A rate of r KiB/s grows by whole KiB every 10^6 / gcd(10^6, r) µs; the quantum is both rates' lcm of those. */
    unsigned long long tx_step = 1000000 / gcd_ull(1000000, gpu->nvlink_tx_rate);
    unsigned long long rx_step = 1000000 / gcd_ull(1000000, gpu->nvlink_rx_rate);
    unsigned long long quantum = tx_step / gcd_ull(tx_step, rx_step) * rx_step;
    unsigned long long steps =
        now_us > gpu->nvlink_since_us ? (unsigned long long)(now_us - gpu->nvlink_since_us) / quantum : 0;
    *at = gpu->nvlink_since_us + (long long)(steps * quantum);
    *tx = gpu->nvlink_tx_kib + steps * (gpu->nvlink_tx_rate * quantum / 1000000);
    *rx = gpu->nvlink_rx_kib + steps * (gpu->nvlink_rx_rate * quantum / 1000000);
}

/* Re-read the state and the layout when either file changed; keep every event generation that did not
 * change, and each GPU's NVLink counters. Locked. */
static int refresh_locked(void)
{
    char previous_state[PATH_MAX], previous_layout[PATH_MAX];
    copy_text(previous_state, sizeof previous_state, state_path);
    copy_text(previous_layout, sizeof previous_layout, layout_path);
    find_paths(); /* the environment may name other files now */
    if (strcmp(previous_state, state_path) != 0) {
        state.valid = 0;
        memset(&state_stamp, 0, sizeof state_stamp);
    }
    if (strcmp(previous_layout, layout_path) != 0)
        memset(&layout_stamp, 0, sizeof layout_stamp);
    int state_changed = file_changed(state_path, &state_stamp);
    if (!state_stamp.exists) {
        state.valid = 0;
        return -1;
    }
    int layout_changed = file_changed(layout_path, &layout_stamp) || strcmp(previous_layout, layout_path) != 0;
    if (state_changed || !state.valid) {
        FILE *file = fopen(state_path, "re");
        if (file == NULL) {
            state.valid = 0;
            return -1;
        }
        static mock_state_t fresh;
        int parsed = parse_state(file, &fresh);
        fclose(file);
        if (parsed != 0) {
            memset(&state_stamp, 0, sizeof state_stamp); /* a half-written or foreign file: try again */
            return state.valid ? 0 : -1;                 /* and keep what was read before */
        }
        for (int i = 0; i < fresh.count; i++) {
            mock_gpu_t *gpu = &fresh.gpu[i];
            const mock_gpu_t *old = NULL;
            for (int j = 0; state.valid && j < state.count; j++)
                if (strcmp(state.gpu[j].uuid, gpu->uuid) == 0)
                    old = &state.gpu[j];
            gpu->xid_generation = old ? old->xid_generation + (old->xid != gpu->xid) : (gpu->xid ? 1 : 0);
            if (old && old->nvlink_tx_rate == gpu->nvlink_tx_rate && old->nvlink_rx_rate == gpu->nvlink_rx_rate) {
                gpu->nvlink_since_us = old->nvlink_since_us;
                gpu->nvlink_tx_kib = old->nvlink_tx_kib;
                gpu->nvlink_rx_kib = old->nvlink_rx_kib;
            } else if (old) { /* new rates: from where the old ones brought the counters */
                nvlink_counters(old, realtime_us(), &gpu->nvlink_since_us, &gpu->nvlink_tx_kib, &gpu->nvlink_rx_kib);
            }
        }
        /* Copied into the live state: handles point into it and must stay valid. */
        memcpy(&state, &fresh, offsetof(mock_state_t, gpu) + (size_t)fresh.count * sizeof fresh.gpu[0]);
        state.valid = 1;
    }
    if (layout_changed)
        read_layout();
    if (state_changed || layout_changed)
        merge_layouts();
    return 0;
}

/* ---- changing the layout: one writer at a time on the node, a new file renamed over the old ---------- */
static int layout_lock_fd = -1;

/* Takes the node-wide writer lock and reads the layout anew, so a change starts from what is in place. */
static nvmlReturn_t layout_begin(void)
{
    char lock_path[PATH_MAX + 8];
    snprintf(lock_path, sizeof lock_path, "%s.lock", layout_path);
    int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return errno == EACCES || errno == EROFS || errno == EPERM ? NVML_ERROR_NO_PERMISSION
                                                                   : NVML_ERROR_UNKNOWN;
    if (flock(fd, LOCK_EX) != 0) {
        close(fd);
        return NVML_ERROR_UNKNOWN;
    }
    layout_lock_fd = fd;
    memset(&layout_stamp, 0, sizeof layout_stamp);
    file_changed(layout_path, &layout_stamp);
    read_layout();
    merge_layouts();
    return NVML_SUCCESS;
}

static void layout_end(void)
{
    if (layout_lock_fd >= 0) {
        flock(layout_lock_fd, LOCK_UN);
        close(layout_lock_fd);
        layout_lock_fd = -1;
    }
}

static void write_mig(FILE *out, const char *uuid, const char *seed, const mock_mig_t *mig)
{
    fprintf(out, "gpu %s %s %d %d %lu\n", uuid, seed[0] ? seed : "-", mig->current, mig->pending, mig->serial);
    for (int g = 0; g < MAX_GI; g++) {
        const mock_gi_t *gi = &mig->gi[g];
        if (!gi->live)
            continue;
        fprintf(out, "gi %d %u %u %u\n", g, gi->profile, gi->start, gi->size);
        for (int c = 0; c < MAX_CI; c++) {
            const mock_ci_t *ci = &gi->ci[c];
            if (ci->live)
                fprintf(out, "ci %d %d %u %u %u %llu %s %s\n", g, c, ci->profile, ci->start, ci->size,
                        ci->memory_mib, ci->uuid, ci->name);
        }
    }
}

/* Puts GPU `gpu`'s new layout in place for every process: the layout file with that GPU's entry replaced
 * (entries of GPUs the state no longer has are dropped), renamed over the old one; `gpu` NULL writes the
 * layouts as they are, with the persistence modes `layout` holds. Ends the change. */
static nvmlReturn_t layout_commit(mock_gpu_t *gpu, const mock_mig_t *next)
{
    char temp[PATH_MAX + 32];
    snprintf(temp, sizeof temp, "%s.%ld.tmp", layout_path, (long)getpid());
    FILE *out = fopen(temp, "we");
    if (out == NULL) {
        layout_end();
        return errno == EACCES || errno == EROFS || errno == EPERM ? NVML_ERROR_NO_PERMISSION
                                                                   : NVML_ERROR_UNKNOWN;
    }
    fprintf(out, "# The MIG layouts NVML clients made (mock libnvidia-ml.so.1, labs and CI only).\n");
    fprintf(out, "format gpuops-mock-nvml-mig 1\n");
    for (int i = 0; i < state.count; i++) {
        const mock_gpu_t *other = &state.gpu[i];
        if (gpu != NULL && other == gpu) {
            write_mig(out, gpu->uuid, gpu->mig_seed, next);
        } else {
            const mock_layout_entry_t *kept = layout_entry(&layout, other->uuid);
            if (kept && strcmp(kept->seed, other->mig_seed) == 0) /* one the spec replaced is gone */
                write_mig(out, kept->uuid, kept->seed, &kept->mig);
        }
    }
    for (int p = 0; p < layout.persistence_count; p++) /* of GPUs the state still has */
        for (int i = 0; i < state.count; i++)
            if (strcmp(layout.persistence[p].uuid, state.gpu[i].uuid) == 0)
                fprintf(out, "persistence %s %d\n", layout.persistence[p].uuid, layout.persistence[p].mode);
    int failed = fflush(out) != 0;
    failed |= fclose(out) != 0;
    if (failed || rename(temp, layout_path) != 0) {
        unlink(temp);
        layout_end();
        return NVML_ERROR_UNKNOWN;
    }
    memset(&layout_stamp, 0, sizeof layout_stamp);
    file_changed(layout_path, &layout_stamp);
    read_layout();
    merge_layouts();
    layout_end();
    return NVML_SUCCESS;
}

/* ---- NVML clients: a MIG mode change resets the GPU, which another client's open handle prevents ----- */
static void client_path(char *path, size_t size)
{
    snprintf(path, size, "%.*s.clients", PATH_MAX - 16, layout_path);
}

/* While NVML is initialised, this process holds a read lock on the clients file (released when it exits). */
static void client_register(void)
{
    char path[PATH_MAX];
    client_path(path, sizeof path);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0)
        fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return; /* a client that cannot reach the file cannot be counted */
    struct flock hold = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    if (fcntl(fd, F_SETLK, &hold) != 0) {
        close(fd);
        return;
    }
    client_fd = fd;
}

static void client_unregister(void)
{
    if (client_fd >= 0) {
        close(client_fd);
        client_fd = -1;
    }
}

/* Whether a process other than this one has NVML initialised on this node. */
static int other_clients(void)
{
    char path[PATH_MAX];
    client_path(path, sizeof path);
    struct stat mine, named;
    int fd = -1, opened = 0;
    if (client_fd >= 0 && fstat(client_fd, &mine) == 0 && stat(path, &named) == 0 && mine.st_ino == named.st_ino &&
        mine.st_dev == named.st_dev) {
        fd = client_fd; /* closing another descriptor of this file would drop this process's lock */
    } else {
        fd = open(path, O_RDONLY | O_CLOEXEC);
        opened = 1;
    }
    if (fd < 0)
        return 0;
    struct flock probe = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    int others = fcntl(fd, F_GETLK, &probe) == 0 && probe.l_type != F_UNLCK;
    if (opened)
        close(fd);
    return others;
}

/* ---- helpers ------------------------------------------------------------------------------------ */
static nvmlReturn_t ready_locked(void)
{
    if (refcount <= 0)
        return NVML_ERROR_UNINITIALIZED;
    refresh_locked();
    return NVML_SUCCESS;
}

static int is_gpu_handle(nvmlDevice_t device)
{
    return device != NULL && !device->is_mig && device->index >= 0 && device->index < state.count &&
           device == &state.gpu[device->index].handle;
}

/* The compute instance a MIG device handle stands for, or NULL (not a MIG handle, or one destroyed since). */
static mock_ci_t *as_mig(nvmlDevice_t device)
{
    if (device == NULL || !device->is_mig || device->index < 0 || device->index >= state.count ||
        device->gi < 0 || device->gi >= MAX_GI || device->ci < 0 || device->ci >= MAX_CI)
        return NULL;
    mock_gpu_t *gpu = &state.gpu[device->index];
    mock_gi_t *gi = &gpu->mig.gi[device->gi];
    mock_ci_t *ci = &gi->ci[device->ci];
    return gpu->mig.current && gi->live && ci->live && &ci->handle == device ? ci : NULL;
}

/* The physical GPU behind a handle (a MIG device's parent), or NULL for a handle that is no device. */
static mock_gpu_t *gpu_of(nvmlDevice_t device)
{
    if (is_gpu_handle(device))
        return &state.gpu[device->index];
    if (as_mig(device))
        return &state.gpu[device->index];
    return NULL;
}

/* Locks, checks init, resolves the device; returns with the lock held only on success. */
static nvmlReturn_t begin_device(nvmlDevice_t device, mock_gpu_t **gpu)
{
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = ready_locked();
    if (rc == NVML_SUCCESS) {
        *gpu = gpu_of(device);
        if (*gpu == NULL)
            rc = NVML_ERROR_INVALID_ARGUMENT;
        else if ((*gpu)->lost)
            rc = NVML_ERROR_GPU_IS_LOST;
    }
    if (rc != NVML_SUCCESS)
        pthread_mutex_unlock(&lock);
    return rc;
}

static nvmlReturn_t end(nvmlReturn_t rc)
{
    pthread_mutex_unlock(&lock);
    return rc;
}

static nvmlReturn_t put_text(char *buffer, unsigned int length, const char *text)
{
    if (buffer == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buffer, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

static void fill_pci(const mock_gpu_t *gpu, nvmlPciInfo_t *pci)
{
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", gpu->domain, gpu->bus, gpu->device,
             gpu->function);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", gpu->domain, gpu->bus, gpu->device, gpu->function);
    pci->domain = gpu->domain;
    pci->bus = gpu->bus;
    pci->device = gpu->device;
    pci->pciDeviceId = gpu->pci_device_id;
    pci->pciSubSystemId = gpu->pci_subsystem_id;
}

/* ---- init, shutdown, errors, system ----------------------------------------------------------- */
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    ENTER("nvmlInitWithFlags");
    pthread_mutex_lock(&lock);
    if (refresh_locked() != 0)
        return end(NVML_ERROR_DRIVER_NOT_LOADED);
    /* As NVIDIA's library answers where the loaded kernel module is not its own version. */
    if (state.kernel_module_version[0] && strcmp(state.kernel_module_version, state.driver_version) != 0)
        return end(NVML_ERROR_LIB_RM_VERSION_MISMATCH);
    if (refcount++ == 0)
        client_register();
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    ENTER("nvmlInit_v2");
    return nvmlInitWithFlags(0);
}

EXPORT nvmlReturn_t nvmlInit(void)
{
    ENTER("nvmlInit");
    return nvmlInitWithFlags(0);
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    ENTER("nvmlShutdown");
    pthread_mutex_lock(&lock);
    if (refcount <= 0)
        return end(NVML_ERROR_UNINITIALIZED);
    if (--refcount == 0)
        client_unregister();
    return end(NVML_SUCCESS);
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    trace("nvmlErrorString");
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Ran out of critical resources, other than memory";
    case NVML_ERROR_NOT_READY: return "Not Ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    ENTER("nvmlSystemGetDriverVersion");
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = ready_locked();
    return end(rc ? rc : put_text(version, length, state.driver_version));
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    ENTER("nvmlSystemGetNVMLVersion");
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = ready_locked();
    return end(rc ? rc : put_text(version, length, state.nvml_version));
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version)
{
    ENTER("nvmlSystemGetCudaDriverVersion");
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = ready_locked();
    if (rc == NVML_SUCCESS && version == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *version = state.cuda_version;
    return end(rc);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version)
{
    ENTER("nvmlSystemGetCudaDriverVersion_v2");
    return nvmlSystemGetCudaDriverVersion(version);
}

/* ---- device handles ----------------------------------------------------------------------------- */
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    ENTER("nvmlDeviceGetCount_v2");
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = ready_locked();
    if (rc == NVML_SUCCESS && count == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *count = (unsigned int)state.count;
    return end(rc);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count)
{
    ENTER("nvmlDeviceGetCount");
    return nvmlDeviceGetCount_v2(count);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    ENTER("nvmlDeviceGetHandleByIndex_v2");
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = ready_locked();
    if (rc == NVML_SUCCESS && (device == NULL || index >= (unsigned int)state.count))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && state.gpu[index].lost)
        rc = NVML_ERROR_GPU_IS_LOST;
    if (rc == NVML_SUCCESS)
        *device = &state.gpu[index].handle;
    return end(rc);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    ENTER("nvmlDeviceGetHandleByIndex");
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    ENTER("nvmlDeviceGetHandleByUUID");
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = ready_locked();
    if (rc != NVML_SUCCESS)
        return end(rc);
    if (uuid == NULL || device == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < state.count; i++) {
        mock_gpu_t *gpu = &state.gpu[i];
        if (strcmp(gpu->uuid, uuid) == 0) {
            if (gpu->lost)
                return end(NVML_ERROR_GPU_IS_LOST);
            *device = &gpu->handle;
            return end(NVML_SUCCESS);
        }
        for (int g = 0; gpu->mig.current && g < MAX_GI; g++) {
            for (int c = 0; gpu->mig.gi[g].live && c < MAX_CI; c++) {
                mock_ci_t *ci = &gpu->mig.gi[g].ci[c];
                if (ci->live && strcmp(ci->uuid, uuid) == 0) {
                    *device = &ci->handle;
                    return end(gpu->lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS);
                }
            }
        }
    }
    return end(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device)
{
    ENTER("nvmlDeviceGetHandleByPciBusId_v2");
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = ready_locked();
    if (rc != NVML_SUCCESS)
        return end(rc);
    unsigned int domain = 0, bus = 0, dev = 0, function = 0;
    if (bus_id == NULL || device == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    int fields = sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &function);
    if (fields < 3) {
        domain = 0;
        fields = sscanf(bus_id, "%x:%x.%x", &bus, &dev, &function);
        if (fields < 2)
            return end(NVML_ERROR_INVALID_ARGUMENT);
    }
    for (int i = 0; i < state.count; i++) {
        mock_gpu_t *gpu = &state.gpu[i];
        if (gpu->domain == domain && gpu->bus == bus && gpu->device == dev && gpu->function == function) {
            if (gpu->lost)
                return end(NVML_ERROR_GPU_IS_LOST);
            *device = &gpu->handle;
            return end(NVML_SUCCESS);
        }
    }
    return end(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *device)
{
    ENTER("nvmlDeviceGetHandleByPciBusId");
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

/* ---- device attributes ------------------------------------------------------------------------ */
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    ENTER("nvmlDeviceGetUUID");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    mock_ci_t *mig = as_mig(device);
    return end(put_text(uuid, length, mig ? mig->uuid : gpu->uuid));
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    ENTER("nvmlDeviceGetName");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    mock_ci_t *mig = as_mig(device);
    char text[TEXT + 48];
    if (mig)
        snprintf(text, sizeof text, "%s MIG %s", gpu->name, mig->name);
    else
        snprintf(text, sizeof text, "%s", gpu->name);
    return end(put_text(name, length, text));
}

EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    ENTER("nvmlDeviceGetSerial");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    return end(put_text(serial, length, gpu->serial));
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    ENTER("nvmlDeviceGetIndex");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (index == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    *index = (unsigned int)gpu->handle.index;
    return end(NVML_SUCCESS);
}

static nvmlReturn_t pci_info(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (pci == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    fill_pci(gpu, pci);
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    ENTER("nvmlDeviceGetPciInfo_v3");
    return pci_info(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    ENTER("nvmlDeviceGetPciInfo_v2");
    return pci_info(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    ENTER("nvmlDeviceGetPciInfo");
    return pci_info(device, pci);
}

static unsigned long long memory_mib_of(nvmlDevice_t device, const mock_gpu_t *gpu)
{
    mock_ci_t *mig = as_mig(device);
    return mig ? mig->memory_mib : gpu->memory_mib;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    ENTER("nvmlDeviceGetMemoryInfo");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (memory == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long total = memory_mib_of(device, gpu) * 1024ULL * 1024ULL;
    /* The spec's use is the whole GPU's; a MIG device's memory is its own and unused. The first version counts
     * what the driver reserves as used, as NVML's does. */
    unsigned long long used = as_mig(device) ? 0 : (gpu->memory_used_mib + gpu->memory_reserved_mib) << 20;
    memory->total = total;
    memory->used = used;
    memory->free = total - used;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    ENTER("nvmlDeviceGetMemoryInfo_v2");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (memory == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long total = memory_mib_of(device, gpu) * 1024ULL * 1024ULL;
    /* What the driver reserves and what is used are the spec's readings (none on an idle GPU by default). */
    unsigned long long used = as_mig(device) ? 0 : gpu->memory_used_mib << 20;
    unsigned long long reserved = as_mig(device) ? 0 : gpu->memory_reserved_mib << 20;
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = total - used - reserved;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    ENTER("nvmlDeviceGetCudaComputeCapability");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (major == NULL || minor == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    *major = gpu->cc_major;
    *minor = gpu->cc_minor;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch)
{
    ENTER("nvmlDeviceGetArchitecture");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (arch == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    *arch = (unsigned int)gpu->architecture;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, int *brand)
{
    ENTER("nvmlDeviceGetBrand");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (brand == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    *brand = gpu->brand;
    return end(NVML_SUCCESS);
}

/* Every simulated GPU is a bare-metal one: NVML_GPU_VIRTUALIZATION_MODE_NONE (0 in nvml.h), never passthrough
 * or a vGPU guest. NVIDIA's DRA driver asks it before it offers dynamic MIG (a vGPU guest cannot repartition). */
EXPORT nvmlReturn_t nvmlDeviceGetVirtualizationMode(nvmlDevice_t device, int *mode)
{
    ENTER("nvmlDeviceGetVirtualizationMode");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (mode == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    *mode = 0;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor)
{
    ENTER("nvmlDeviceGetMinorNumber");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (minor == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (as_mig(device))
        return end(NVML_ERROR_NOT_SUPPORTED);
    *minor = (unsigned int)gpu->minor_number;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node)
{
    ENTER("nvmlDeviceGetNumaNodeId");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (node == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (gpu->numa_node < 0)
        return end(NVML_ERROR_NOT_SUPPORTED);
    *node = (unsigned int)gpu->numa_node;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int size, unsigned long *set)
{
    ENTER("nvmlDeviceGetCpuAffinity");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (set == NULL || size == 0)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned int i = 0; i < size; i++)
        set[i] = i < 4 ? gpu->cpu_affinity[i] : 0;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t device, unsigned int size, unsigned long *set,
                                                        unsigned int scope)
{
    (void)scope;
    ENTER("nvmlDeviceGetCpuAffinityWithinScope");
    return nvmlDeviceGetCpuAffinity(device, size, set);
}

/* Kept for every process on the node, in the layout file: a GPU in persistence mode cannot be reset
 * (gpuopsMockNvmlResetGpu), as a driver in persistence mode keeps the GPU open. */
EXPORT nvmlReturn_t nvmlDeviceSetPersistenceMode(nvmlDevice_t device, int mode)
{
    ENTER("nvmlDeviceSetPersistenceMode");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if ((mode != 0 && mode != 1) || as_mig(device))
        return end(NVML_ERROR_INVALID_ARGUMENT);
    rc = layout_begin();
    if (rc)
        return end(rc);
    mock_persistence_t *kept = NULL;
    for (int p = 0; p < layout.persistence_count; p++)
        if (strcmp(layout.persistence[p].uuid, gpu->uuid) == 0)
            kept = &layout.persistence[p];
    if (kept == NULL) {
        if (layout.persistence_count >= MAX_GPUS) {
            layout_end();
            return end(NVML_ERROR_UNKNOWN);
        }
        kept = &layout.persistence[layout.persistence_count++];
        copy_text(kept->uuid, sizeof kept->uuid, gpu->uuid);
    }
    kept->mode = mode;
    return end(layout_commit(NULL, NULL));
}

EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, int *mode)
{
    ENTER("nvmlDeviceGetPersistenceMode");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (mode == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    *mode = gpu->persistence ? 1 : 0;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types)
{
    ENTER("nvmlDeviceGetSupportedEventTypes");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (types == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    *types = NVML_SUPPORTED_EVENTS;
    return end(NVML_SUCCESS);
}

/* Readings: the spec's defaults, the same on every call. */
EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temperature)
{
    ENTER("nvmlDeviceGetTemperature");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (temperature == NULL || sensor != 0)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    *temperature = gpu->temperature_c;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *milliwatts)
{
    ENTER("nvmlDeviceGetPowerUsage");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (milliwatts == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    *milliwatts = gpu->power_mw;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *milliwatts)
{
    ENTER("nvmlDeviceGetEnforcedPowerLimit");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (milliwatts == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    *milliwatts = gpu->power_limit_mw;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *milliwatts)
{
    ENTER("nvmlDeviceGetPowerManagementLimit");
    return nvmlDeviceGetEnforcedPowerLimit(device, milliwatts);
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    ENTER("nvmlDeviceGetUtilizationRates");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (utilization == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (as_mig(device))
        return end(NVML_ERROR_NOT_SUPPORTED);
    utilization->gpu = gpu->util_gpu;
    utilization->memory = gpu->util_memory;
    return end(NVML_SUCCESS);
}

/* A reading of the whole GPU: a MIG device answers NOT_SUPPORTED, as NVML does for these. */
static nvmlReturn_t whole_gpu(nvmlDevice_t device, const void *out, mock_gpu_t **gpu)
{
    nvmlReturn_t rc = begin_device(device, gpu);
    if (rc)
        return rc;
    if (out == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (as_mig(device))
        return end(NVML_ERROR_NOT_SUPPORTED);
    return NVML_SUCCESS; /* the lock is held */
}

EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                    unsigned int *samplingPeriodUs)
{
    ENTER("nvmlDeviceGetEncoderUtilization");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = whole_gpu(device, samplingPeriodUs ? utilization : NULL, &gpu);
    if (rc)
        return rc;
    *utilization = gpu->util_encoder;
    *samplingPeriodUs = 167000; /* NVML's period for the codecs: 1/6 s */
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                    unsigned int *samplingPeriodUs)
{
    ENTER("nvmlDeviceGetDecoderUtilization");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = whole_gpu(device, samplingPeriodUs ? utilization : NULL, &gpu);
    if (rc)
        return rc;
    *utilization = gpu->util_decoder;
    *samplingPeriodUs = 167000;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy)
{
    ENTER("nvmlDeviceGetTotalEnergyConsumption");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = whole_gpu(device, energy, &gpu);
    if (rc)
        return rc;
    *energy = gpu->energy_mj;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value)
{
    ENTER("nvmlDeviceGetPcieReplayCounter");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = whole_gpu(device, value, &gpu);
    if (rc)
        return rc;
    *value = gpu->pcie_replays;
    return end(NVML_SUCCESS);
}

/* ---- GPM: GPU performance monitoring (nvml.h's nvmlGpm* API, Hopper and newer) --------------------- */
#define NVML_DEVICE_ARCH_HOPPER 9
#define NVML_DEVICE_ARCH_UNKNOWN 0xFFFFFFFFu
#define NVML_GPM_SUPPORT_VERSION 1
#define NVML_GPM_METRICS_GET_VERSION 1
/* nvml.h's array size; a caller fills numMetrics of them and the library reads no further. */
#define NVML_GPM_METRIC_MAX 477
enum {
    NVML_GPM_METRIC_GRAPHICS_UTIL = 1,
    NVML_GPM_METRIC_HMMA_TENSOR_UTIL = 7,
    NVML_GPM_METRIC_DRAM_BW_UTIL = 10,
    NVML_GPM_METRIC_PCIE_TX_PER_SEC = 20,
    NVML_GPM_METRIC_PCIE_RX_PER_SEC = 21,
};

typedef struct {
    unsigned int version;
    unsigned int isSupportedDevice;
} nvmlGpmSupport_t;

/* An opaque sample: here, the GPU it was taken of and what the spec said then. */
#define GPM_SAMPLE_MAGIC 0x47504d53u
typedef struct nvmlGpmSample_st {
    unsigned int magic;
    int gpu; /* -1: not taken yet */
    int instance; /* 0: the whole GPU's sample; a MIG GPU instance's: its ID + 1 */
    struct timespec taken;
    unsigned int graphics, tensor, dram;
    unsigned long long pcie_tx, pcie_rx;
} *nvmlGpmSample_t;

typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct {
        char *shortName;
        char *longName;
        char *unit;
    } metricInfo;
} nvmlGpmMetric_t;

typedef struct {
    unsigned int version;
    unsigned int numMetrics;
    nvmlGpmSample_t sample1;
    nvmlGpmSample_t sample2;
    nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;

static int gpm_capable(const mock_gpu_t *gpu)
{
    return gpu->architecture >= NVML_DEVICE_ARCH_HOPPER && (unsigned int)gpu->architecture != NVML_DEVICE_ARCH_UNKNOWN;
}

EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *support)
{
    ENTER("nvmlGpmQueryDeviceSupport");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (support == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (support->version != NVML_GPM_SUPPORT_VERSION)
        return end(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    support->isSupportedDevice = !as_mig(device) && gpm_capable(gpu);
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample)
{
    ENTER("nvmlGpmSampleAlloc");
    if (sample == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *sample = calloc(1, sizeof **sample);
    if (*sample == NULL)
        return NVML_ERROR_MEMORY;
    (*sample)->magic = GPM_SAMPLE_MAGIC;
    (*sample)->gpu = -1;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample)
{
    ENTER("nvmlGpmSampleFree");
    if (sample == NULL || sample->magic != GPM_SAMPLE_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    sample->magic = 0;
    free(sample);
    return NVML_SUCCESS;
}

static void take_gpm_sample(const mock_gpu_t *gpu, nvmlGpmSample_t sample, int instance)
{
    sample->gpu = (int)(gpu - state.gpu);
    sample->instance = instance;
    clock_gettime(CLOCK_MONOTONIC, &sample->taken);
    sample->graphics = gpu->gpm_graphics;
    sample->tensor = gpu->gpm_tensor;
    sample->dram = gpu->gpm_dram;
    sample->pcie_tx = gpu->gpm_pcie_tx;
    sample->pcie_rx = gpu->gpm_pcie_rx;
}

/* A sample's GPU: a whole GPU with GPM and a sample this library allocated (the lock is held on success). */
static nvmlReturn_t gpm_sample_of(nvmlDevice_t device, nvmlGpmSample_t sample, mock_gpu_t **gpu)
{
    nvmlReturn_t rc = whole_gpu(device, sample, gpu);
    if (rc)
        return rc;
    if (sample->magic != GPM_SAMPLE_MAGIC)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (!gpm_capable(*gpu))
        return end(NVML_ERROR_NOT_SUPPORTED);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t sample)
{
    ENTER("nvmlGpmSampleGet");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = gpm_sample_of(device, sample, &gpu);
    if (rc)
        return rc;
    take_gpm_sample(gpu, sample, 0);
    return end(NVML_SUCCESS);
}

/* A MIG GPU instance's sample: the GPU's handle and the instance's ID, as nvml.h has it. The spec has no readings per
 * instance, so an instance's activity is its GPU's rates (a TEST DOUBLE's choice); its metrics leave out what DCGM
 * gives at the GPU level only (PCIe traffic, dcgm_fields.cpp's DCGM_FE_GPU). An ID with no live instance in the
 * GPU's current layout is not found. */
EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId, nvmlGpmSample_t sample)
{
    ENTER("nvmlGpmMigSampleGet");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = gpm_sample_of(device, sample, &gpu);
    if (rc)
        return rc;
    if (!gpu->mig.current || gpuInstanceId >= MAX_GI || !gpu->mig.gi[gpuInstanceId].live)
        return end(NVML_ERROR_NOT_FOUND);
    take_gpm_sample(gpu, sample, (int)gpuInstanceId + 1);
    return end(NVML_SUCCESS);
}

static int taken_before(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/* Each metric over the interval between the two samples of one GPU: the spec's rate at the second (a rate the
 * spec sets holds over the whole interval). metricInfo is left empty: nothing here knows NVML's own texts. */
EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metrics)
{
    ENTER("nvmlGpmMetricsGet");
    if (metrics == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (metrics->version != NVML_GPM_METRICS_GET_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlGpmSample_t first = metrics->sample1, second = metrics->sample2;
    if (metrics->numMetrics > NVML_GPM_METRIC_MAX || first == NULL || second == NULL || first->magic != GPM_SAMPLE_MAGIC
        || second->magic != GPM_SAMPLE_MAGIC || first->gpu < 0 || first->gpu != second->gpu
        || first->instance != second->instance || !taken_before(&first->taken, &second->taken))
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < metrics->numMetrics; i++) {
        nvmlGpmMetric_t *metric = &metrics->metrics[i];
        memset(&metric->metricInfo, 0, sizeof metric->metricInfo);
        metric->nvmlReturn = NVML_SUCCESS;
        switch (metric->metricId) {
        case NVML_GPM_METRIC_GRAPHICS_UTIL:
            metric->value = second->graphics;
            break;
        case NVML_GPM_METRIC_HMMA_TENSOR_UTIL:
            metric->value = second->tensor;
            break;
        case NVML_GPM_METRIC_DRAM_BW_UTIL:
            metric->value = second->dram;
            break;
        case NVML_GPM_METRIC_PCIE_TX_PER_SEC:
        case NVML_GPM_METRIC_PCIE_RX_PER_SEC:
            if (second->instance) { /* the GPU's link, not an instance's */
                metric->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
                metric->value = 0;
            } else {
                metric->value = (double)(metric->metricId == NVML_GPM_METRIC_PCIE_TX_PER_SEC ? second->pcie_tx
                                                                                             : second->pcie_rx);
            }
            break;
        default: /* a metric this library does not model */
            metric->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            metric->value = 0;
            break;
        }
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                              unsigned int *isPending, unsigned int *failureOccurred)
{
    ENTER("nvmlDeviceGetRemappedRows");
    mock_gpu_t *gpu;
    int all = corrRows && uncRows && isPending && failureOccurred;
    nvmlReturn_t rc = whole_gpu(device, all ? corrRows : NULL, &gpu);
    if (rc)
        return rc;
    *corrRows = gpu->remapped_correctable;
    *uncRows = gpu->remapped_uncorrectable;
    *isPending = gpu->remap_pending;
    *failureOccurred = gpu->remap_failure;
    return end(NVML_SUCCESS);
}

static nvmlReturn_t clock_of(nvmlDevice_t device, int type, unsigned int *mhz)
{
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (mhz == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    switch (type) {
    case 0: *mhz = gpu->clock_graphics; break;
    case 1: *mhz = gpu->clock_sm; break;
    case 2: *mhz = gpu->clock_memory; break;
    case 3: *mhz = gpu->clock_video; break;
    default: return end(NVML_ERROR_INVALID_ARGUMENT);
    }
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *mhz)
{
    ENTER("nvmlDeviceGetClockInfo");
    return clock_of(device, type, mhz);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned int *mhz)
{
    ENTER("nvmlDeviceGetMaxClockInfo");
    return clock_of(device, type, mhz);
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int error_type, int counter_type,
                                                unsigned long long *count)
{
    (void)counter_type;
    ENTER("nvmlDeviceGetTotalEccErrors");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (count == NULL || (error_type != 0 && error_type != 1))
        return end(NVML_ERROR_INVALID_ARGUMENT);
    *count = error_type == 0 ? gpu->ecc_corrected : gpu->ecc_uncorrected;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, int *current, int *pending)
{
    ENTER("nvmlDeviceGetEccMode");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (current == NULL || pending == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    *current = *pending = 1;
    return end(NVML_SUCCESS);
}

/* Field values (nvml.h's nvmlFieldValue_t): NVML_FI_DEV_MEMORY_TEMP where the spec gives the GPU a memory
 * temperature; NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX and _RX (KiB, nvlink_counters) of all links (scopeId UINT_MAX)
 * on a GPU with NVLink peers, both stamped with the same instant (a single link's are not modelled: not supported);
 * every other field answers NVML_ERROR_NOT_SUPPORTED in its own nvmlReturn, as a driver does for a field it does not
 * know, and the call itself succeeds. A MIG device answers none. */
#define NVML_FI_DEV_MEMORY_TEMP 82
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX 138
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX 139
#define NVML_VALUE_TYPE_UNSIGNED_INT 1
#define NVML_VALUE_TYPE_UNSIGNED_LONG_LONG 3
typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values)
{
    ENTER("nvmlDeviceGetFieldValues");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (valuesCount < 0 || (valuesCount > 0 && values == NULL))
        return end(NVML_ERROR_INVALID_ARGUMENT);
    int nvlink = gpu->links > 0 && !as_mig(device);
    long long at = 0;
    unsigned long long sent = 0, received = 0;
    if (nvlink)
        nvlink_counters(gpu, realtime_us(), &at, &sent, &received);
    for (int i = 0; i < valuesCount; i++) {
        unsigned int field = values[i].fieldId;
        values[i].timestamp = 0;
        values[i].latencyUsec = 0;
        values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        values[i].value.ullVal = 0;
        if (field == NVML_FI_DEV_MEMORY_TEMP && gpu->memory_temperature_c && !as_mig(device)) {
            values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            values[i].value.uiVal = gpu->memory_temperature_c;
            values[i].nvmlReturn = NVML_SUCCESS;
        } else if ((field == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX || field == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)
                   && nvlink && values[i].scopeId == UINT_MAX) {
            values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
            values[i].value.ullVal = field == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX ? sent : received;
            values[i].timestamp = at;
            values[i].nvmlReturn = NVML_SUCCESS;
        }
    }
    return end(NVML_SUCCESS);
}

/* ---- topology and NVLink ------------------------------------------------------------------------ */
EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t first, nvmlDevice_t second, int *level)
{
    ENTER("nvmlDeviceGetTopologyCommonAncestor");
    mock_gpu_t *a, *b;
    nvmlReturn_t rc = begin_device(first, &a);
    if (rc)
        return rc;
    b = gpu_of(second);
    if (b == NULL || level == NULL || as_mig(first) || as_mig(second))
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (b->lost)
        return end(NVML_ERROR_GPU_IS_LOST);
    if (a == b)
        *level = 0;
    else if (a->pcie_switch[0] && strcmp(a->pcie_switch, b->pcie_switch) == 0)
        *level = NVML_TOPOLOGY_SINGLE;
    else if (a->numa_node >= 0 && a->numa_node == b->numa_node)
        *level = NVML_TOPOLOGY_NODE;
    else if (a->numa_node < 0 && b->numa_node < 0)
        *level = NVML_TOPOLOGY_HOSTBRIDGE;
    else
        *level = NVML_TOPOLOGY_SYSTEM;
    return end(NVML_SUCCESS);
}

/* A GPU with NVLink peers has one active link per peer (links 0..n-1); one without answers NOT_SUPPORTED. */
static nvmlReturn_t link_peer(nvmlDevice_t device, unsigned int link, mock_gpu_t **gpu, mock_gpu_t **peer)
{
    nvmlReturn_t rc = begin_device(device, gpu);
    if (rc)
        return rc;
    if (as_mig(device) || (*gpu)->links == 0)
        return end(NVML_ERROR_NOT_SUPPORTED);
    if (link >= NVML_NVLINK_MAX_LINKS)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    int index = link < (unsigned int)(*gpu)->links ? (*gpu)->link_peer[link] : -1;
    *peer = index >= 0 && index < state.count ? &state.gpu[index] : NULL;
    return NVML_SUCCESS; /* the lock is held */
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int *active)
{
    ENTER("nvmlDeviceGetNvLinkState");
    mock_gpu_t *gpu, *peer;
    nvmlReturn_t rc = link_peer(device, link, &gpu, &peer);
    if (rc)
        return rc;
    if (active == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    *active = peer != NULL;
    return end(NVML_SUCCESS);
}

static nvmlReturn_t remote_pci(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    mock_gpu_t *gpu, *peer;
    nvmlReturn_t rc = link_peer(device, link, &gpu, &peer);
    if (rc)
        return rc;
    if (pci == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (peer == NULL)
        return end(NVML_ERROR_NOT_FOUND);
    fill_pci(peer, pci);
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    ENTER("nvmlDeviceGetNvLinkRemotePciInfo_v2");
    return remote_pci(device, link, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    ENTER("nvmlDeviceGetNvLinkRemotePciInfo");
    return remote_pci(device, link, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link, int *type)
{
    ENTER("nvmlDeviceGetNvLinkRemoteDeviceType");
    mock_gpu_t *gpu, *peer;
    nvmlReturn_t rc = link_peer(device, link, &gpu, &peer);
    if (rc)
        return rc;
    if (type == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (peer == NULL)
        return end(NVML_ERROR_NOT_FOUND);
    *type = 0; /* NVML_NVLINK_DEVICE_TYPE_GPU: the mock's links end at GPUs, not NVSwitches */
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link, unsigned int *version)
{
    ENTER("nvmlDeviceGetNvLinkVersion");
    mock_gpu_t *gpu, *peer;
    nvmlReturn_t rc = link_peer(device, link, &gpu, &peer);
    if (rc)
        return rc;
    if (version == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    *version = gpu->cc_major >= 9 ? 4 : gpu->cc_major >= 8 ? 3 : 2;
    return end(NVML_SUCCESS);
}

/* ---- MIG: mode, MIG devices ------------------------------------------------------------------------ */
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define NVML_STRUCT_VERSION(size, version) ((unsigned int)(size) | ((unsigned int)(version) << 24))

typedef struct mock_instance *nvmlGpuInstance_t;
typedef struct mock_instance *nvmlComputeInstance_t;

typedef struct {
    unsigned int start, size;
} nvmlPlacement_t; /* nvmlGpuInstancePlacement_t and nvmlComputeInstancePlacement_t */

typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount;
    unsigned int decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount;
    unsigned int decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
} nvmlGpuInstanceProfileInfo_v2_t;

typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, copyEngineCount;
    unsigned int decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    unsigned int capabilities;
} nvmlGpuInstanceProfileInfo_v3_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id, profileId;
    nvmlPlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount;
    unsigned int sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount;
    unsigned int sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
} nvmlComputeInstanceProfileInfo_v2_t;

typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount;
    unsigned int sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    unsigned int capabilities;
} nvmlComputeInstanceProfileInfo_v3_t;

typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id, profileId;
    nvmlPlacement_t placement;
} nvmlComputeInstanceInfo_t;

#define GI_INFO_V2 NVML_STRUCT_VERSION(sizeof(nvmlGpuInstanceProfileInfo_v2_t), 2)
#define GI_INFO_V3 NVML_STRUCT_VERSION(sizeof(nvmlGpuInstanceProfileInfo_v3_t), 3)
#define CI_INFO_V2 NVML_STRUCT_VERSION(sizeof(nvmlComputeInstanceProfileInfo_v2_t), 2)
#define CI_INFO_V3 NVML_STRUCT_VERSION(sizeof(nvmlComputeInstanceProfileInfo_v3_t), 3)

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    ENTER("nvmlDeviceGetMigMode");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (current == NULL || pending == NULL || as_mig(device))
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (gpu->mig_mode < 0)
        return end(NVML_ERROR_NOT_SUPPORTED);
    *current = (unsigned int)gpu->mig.current;
    *pending = (unsigned int)gpu->mig.pending;
    return end(NVML_SUCCESS);
}

static int any_gpu_instance(const mock_mig_t *mig)
{
    for (int g = 0; g < MAX_GI; g++)
        if (mig->gi[g].live)
            return 1;
    return 0;
}

/*
 * As the driver does it: the mode to be is pending at once; the driver then resets the GPU to make it
 * current, which succeeds only when no other process has the GPU open (here: has NVML initialised), and
 * otherwise says why in *activation (NVML_ERROR_IN_USE) and leaves the mode pending until a reset
 * (gpuopsMockNvmlResetGpu) or a reboot. MIG mode cannot be disabled while GPU instances exist.
 */
EXPORT nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode, nvmlReturn_t *activation)
{
    ENTER("nvmlDeviceSetMigMode");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (activation == NULL || mode > 1 || as_mig(device))
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (gpu->mig_mode < 0 || gpu->memory_slices == 0) /* no MIG, or a product whose MIG is not modelled */
        return end(NVML_ERROR_NOT_SUPPORTED);
    rc = layout_begin();
    if (rc)
        return end(rc);
    mock_mig_t next = gpu->mig;
    if (mode == 0 && any_gpu_instance(&next)) {
        layout_end();
        return end(NVML_ERROR_IN_USE);
    }
    next.pending = (int)mode;
    nvmlReturn_t status = NVML_SUCCESS;
    if (next.current != (int)mode) {
        if (other_clients())
            status = NVML_ERROR_IN_USE;
        else
            next.current = (int)mode;
    }
    rc = layout_commit(gpu, &next);
    if (rc == NVML_SUCCESS)
        *activation = status;
    return end(rc);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    ENTER("nvmlDeviceGetMaxMigDeviceCount");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (count == NULL || as_mig(device))
        return end(NVML_ERROR_INVALID_ARGUMENT);
    /* A GPU without MIG answers 0, as NVML does; GPUs that offer MIG have seven slots. */
    *count = gpu->mig_mode < 0 ? 0 : MAX_MIG_DEVICES;
    return end(NVML_SUCCESS);
}

/* The MIG devices of a GPU in NVML's order: by GPU-instance ID, then compute-instance ID. */
static mock_ci_t *nth_mig_device(mock_gpu_t *gpu, unsigned int index)
{
    unsigned int seen = 0;
    for (int g = 0; gpu->mig.current && g < MAX_GI; g++)
        for (int c = 0; gpu->mig.gi[g].live && c < MAX_CI; c++)
            if (gpu->mig.gi[g].ci[c].live && seen++ == index)
                return &gpu->mig.gi[g].ci[c];
    return NULL;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                        nvmlDevice_t *mig_device)
{
    ENTER("nvmlDeviceGetMigDeviceHandleByIndex");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (mig_device == NULL || as_mig(device))
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (!gpu->mig.current || index >= MAX_MIG_DEVICES)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    mock_ci_t *ci = nth_mig_device(gpu, index);
    if (ci == NULL)
        return end(NVML_ERROR_NOT_FOUND);
    *mig_device = &ci->handle;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *is_mig)
{
    ENTER("nvmlDeviceIsMigDeviceHandle");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (is_mig == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    *is_mig = as_mig(device) != NULL;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig_device, nvmlDevice_t *device)
{
    ENTER("nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(mig_device, &gpu);
    if (rc)
        return rc;
    if (device == NULL || !as_mig(mig_device))
        return end(NVML_ERROR_INVALID_ARGUMENT);
    *device = &gpu->handle;
    return end(NVML_SUCCESS);
}

static nvmlReturn_t mig_id(nvmlDevice_t device, unsigned int *id, int compute)
{
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (id == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (as_mig(device) == NULL)
        return end(NVML_ERROR_NOT_SUPPORTED);
    *id = (unsigned int)(compute ? device->ci : device->gi);
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    ENTER("nvmlDeviceGetGpuInstanceId");
    return mig_id(device, id, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    ENTER("nvmlDeviceGetComputeInstanceId");
    return mig_id(device, id, 1);
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    ENTER("nvmlDeviceGetAttributes_v2");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (attributes == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    mock_ci_t *mig = as_mig(device);
    memset(attributes, 0, sizeof *attributes);
    if (mig) {
        const mock_gi_t *gi = &gpu->mig.gi[device->gi];
        const mock_gi_profile_t *gp = &gpu->gi_profile[gi->profile];
        const mock_ci_profile_t *cp = &gpu->ci_profile[gi->profile][mig->profile];
        attributes->multiprocessorCount = cp->sm;
        attributes->sharedCopyEngineCount = gp->ce;
        attributes->sharedDecoderCount = gp->dec;
        attributes->sharedEncoderCount = gp->enc;
        attributes->sharedJpegCount = gp->jpeg;
        attributes->sharedOfaCount = gp->ofa;
        attributes->gpuInstanceSliceCount = gp->slices;
        attributes->computeInstanceSliceCount = cp->slices;
        attributes->memorySizeMB = mig->memory_mib;
        return end(NVML_SUCCESS);
    }
    /* The whole GPU: an H100's 132 SMs and its engines. */
    attributes->multiprocessorCount = 132;
    attributes->sharedCopyEngineCount = 7;
    attributes->sharedDecoderCount = 7;
    attributes->sharedJpegCount = 7;
    attributes->sharedOfaCount = 1;
    attributes->gpuInstanceSliceCount = 7;
    attributes->computeInstanceSliceCount = 7;
    attributes->memorySizeMB = gpu->memory_mib;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    ENTER("nvmlDeviceGetAttributes");
    return nvmlDeviceGetAttributes_v2(device, attributes);
}

/* Running processes are not modelled yet. */
#define NOT_SUPPORTED_FUNCTION(name, ...)                \
    EXPORT nvmlReturn_t name(__VA_ARGS__)                \
    {                                                    \
        ENTER(#name);                                    \
        pthread_mutex_lock(&lock);                       \
        nvmlReturn_t rc = ready_locked();                \
        return end(rc ? rc : NVML_ERROR_NOT_SUPPORTED);  \
    }

NOT_SUPPORTED_FUNCTION(nvmlDeviceGetComputeRunningProcesses_v3, nvmlDevice_t d, unsigned int *n, void *infos)
NOT_SUPPORTED_FUNCTION(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlDevice_t d, unsigned int *n, void *infos)

/* ---- MIG: GPU-instance profiles and placements ------------------------------------------------------ */
/* The NVML_GPU_INSTANCE_PROFILE_* index of the profile NVIDIA numbers `id` on this GPU, or -1. */
static int gi_profile_by_id(const mock_gpu_t *gpu, unsigned int id)
{
    for (int p = 0; p < GI_PROFILES; p++)
        if (gpu->gi_profile[p].offered && gpu->gi_profile[p].id == id)
            return p;
    return -1;
}

static int overlaps(unsigned int a, unsigned int a_size, unsigned int b, unsigned int b_size)
{
    return a < b + b_size && b < a + a_size;
}

/* Whether the memory slices [start, start+size) are free of GPU instances. */
static int memory_free(const mock_mig_t *mig, unsigned int start, unsigned int size)
{
    for (int g = 0; g < MAX_GI; g++)
        if (mig->gi[g].live && overlaps(mig->gi[g].start, mig->gi[g].size, start, size))
            return 0;
    return 1;
}

static unsigned int gi_count(const mock_mig_t *mig, int profile)
{
    unsigned int n = 0;
    for (int g = 0; g < MAX_GI; g++)
        n += mig->gi[g].live && (profile < 0 || mig->gi[g].profile == (unsigned int)profile);
    return n;
}

static unsigned int compute_slices_used(const mock_gpu_t *gpu, const mock_mig_t *mig)
{
    unsigned int n = 0;
    for (int g = 0; g < MAX_GI; g++)
        if (mig->gi[g].live)
            n += gpu->gi_profile[mig->gi[g].profile].slices;
    return n;
}

/* Whether one more GPU instance of the profile fits at `start` now. */
static int gi_fits(const mock_gpu_t *gpu, const mock_mig_t *mig, int profile, unsigned int start)
{
    const mock_gi_profile_t *p = &gpu->gi_profile[profile];
    return gi_count(mig, profile) < p->instances && compute_slices_used(gpu, mig) + p->slices <= gpu->compute_slices &&
           memory_free(mig, start, p->memory_slices);
}

/* How many placements, of every profile the GPU offers, that are possible now a GPU instance at
 * [start, start+size) would take away. */
static unsigned int placements_taken(const mock_gpu_t *gpu, const mock_mig_t *mig, unsigned int start,
                                     unsigned int size)
{
    unsigned int n = 0;
    for (int p = 0; p < GI_PROFILES; p++) {
        const mock_gi_profile_t *other = &gpu->gi_profile[p];
        for (int s = 0; other->offered && s < other->starts; s++)
            n += gi_fits(gpu, mig, p, other->start[s]) && overlaps(other->start[s], other->memory_slices, start, size);
    }
    return n;
}

/*
 * Where the driver puts a GPU instance created without a placement: of the free placements, the one that
 * takes away the fewest placements still possible for every profile, the lowest first among equals. This
 * reproduces every sequence NVIDIA's documentation shows (seven 1g on an H100 get IDs 13, 11, 12, 7, 8, 9,
 * 10; two 3g.20gb on an A100 get 2 then 1; 2g.10gb then five 1g.5gb get 5, 13, 7, 8, 9, 10). -1: none fits.
 */
static int choose_gi_start(const mock_gpu_t *gpu, const mock_mig_t *mig, int profile)
{
    const mock_gi_profile_t *p = &gpu->gi_profile[profile];
    /* Test knob: $GPUOPS_MOCK_NVML_PLACEMENT=lowest plays a driver with another placement policy, the lowest
     * free placement (which fragments the GPU: 3g, 2g, 1g, 1g on an H100 then fails at the last 1g). */
    const char *policy = getenv("GPUOPS_MOCK_NVML_PLACEMENT");
    int lowest = policy != NULL && strcmp(policy, "lowest") == 0;
    int best = -1;
    unsigned int best_taken = 0;
    for (int s = 0; s < p->starts; s++) {
        if (!gi_fits(gpu, mig, profile, p->start[s]))
            continue;
        if (lowest)
            return (int)p->start[s];
        unsigned int taken = placements_taken(gpu, mig, p->start[s], p->memory_slices);
        if (best < 0 || taken < best_taken || (taken == best_taken && p->start[s] < (unsigned int)best)) {
            best = (int)p->start[s];
            best_taken = taken;
        }
    }
    return best;
}

static void fill_gi_profile(const mock_gpu_t *gpu, int profile, unsigned int *id, unsigned int *slices,
                            unsigned int *instances, unsigned int *sm, unsigned int *ce, unsigned int *dec,
                            unsigned int *enc, unsigned int *jpeg, unsigned int *ofa, unsigned long long *memory)
{
    const mock_gi_profile_t *p = &gpu->gi_profile[profile];
    *id = p->id;
    *slices = p->slices;
    *instances = p->instances;
    *sm = p->sm;
    *ce = p->ce;
    *dec = p->dec;
    *enc = p->enc;
    *jpeg = p->jpeg;
    *ofa = p->ofa;
    *memory = p->memory_mib;
}

/* Locks and resolves a GPU for a GPU-instance profile query (not a MIG handle; MIG mode current when
 * `enabled`); `profile` an NVML_GPU_INSTANCE_PROFILE_* index: INVALID_ARGUMENT past the enumeration,
 * NOT_SUPPORTED where the product does not offer it. Returns with the lock held only on success. */
static nvmlReturn_t begin_gi_profile(nvmlDevice_t device, unsigned int profile, const void *out, int enabled,
                                     mock_gpu_t **gpu)
{
    nvmlReturn_t rc = begin_device(device, gpu);
    if (rc)
        return rc;
    if (out == NULL || as_mig(device) || profile >= GI_PROFILES)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if ((*gpu)->mig_mode < 0 || (enabled && !(*gpu)->mig.current) || !(*gpu)->gi_profile[profile].offered)
        return end(NVML_ERROR_NOT_SUPPORTED);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                        nvmlGpuInstanceProfileInfo_t *info)
{
    ENTER("nvmlDeviceGetGpuInstanceProfileInfo");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_gi_profile(device, profile, info, 1, &gpu);
    if (rc)
        return rc;
    memset(info, 0, sizeof *info);
    fill_gi_profile(gpu, (int)profile, &info->id, &info->sliceCount, &info->instanceCount,
                    &info->multiprocessorCount, &info->copyEngineCount, &info->decoderCount, &info->encoderCount,
                    &info->jpegCount, &info->ofaCount, &info->memorySizeMB);
    return end(NVML_SUCCESS);
}

static nvmlReturn_t gi_profile_info_v(mock_gpu_t *gpu, int profile, void *out)
{
    unsigned int version = *(unsigned int *)out;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    snprintf(name, sizeof name, "MIG %s", gpu->gi_profile[profile].name);
    if (version == GI_INFO_V2) {
        nvmlGpuInstanceProfileInfo_v2_t *info = out;
        memset(info, 0, sizeof *info);
        info->version = version;
        fill_gi_profile(gpu, profile, &info->id, &info->sliceCount, &info->instanceCount,
                        &info->multiprocessorCount, &info->copyEngineCount, &info->decoderCount,
                        &info->encoderCount, &info->jpegCount, &info->ofaCount, &info->memorySizeMB);
        copy_text(info->name, sizeof info->name, name);
        return NVML_SUCCESS;
    }
    if (version == GI_INFO_V3) {
        nvmlGpuInstanceProfileInfo_v3_t *info = out;
        memset(info, 0, sizeof *info);
        info->version = version;
        fill_gi_profile(gpu, profile, &info->id, &info->sliceCount, &info->instanceCount,
                        &info->multiprocessorCount, &info->copyEngineCount, &info->decoderCount,
                        &info->encoderCount, &info->jpegCount, &info->ofaCount, &info->memorySizeMB);
        copy_text(info->name, sizeof info->name, name);
        return NVML_SUCCESS;
    }
    return NVML_ERROR_INVALID_ARGUMENT; /* nvml.h: "info->version ... invalid" */
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile, void *info)
{
    ENTER("nvmlDeviceGetGpuInstanceProfileInfoV");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_gi_profile(device, profile, info, 1, &gpu);
    if (rc)
        return rc;
    return end(gi_profile_info_v(gpu, (int)profile, info));
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t device, unsigned int id, void *info)
{
    ENTER("nvmlDeviceGetGpuInstanceProfileInfoByIdV");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (info == NULL || as_mig(device))
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (gpu->mig_mode < 0 || !gpu->mig.current)
        return end(NVML_ERROR_NOT_SUPPORTED);
    int profile = gi_profile_by_id(gpu, id);
    if (profile < 0)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    return end(gi_profile_info_v(gpu, profile, info));
}

/* Placements exist whether or not MIG mode is on (nvml.h); `id` is NVIDIA's profile ID. */
static nvmlReturn_t gi_placements(nvmlDevice_t device, unsigned int id, nvmlPlacement_t *placements,
                                  unsigned int *count)
{
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (count == NULL || as_mig(device))
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (gpu->mig_mode < 0 || gpu->memory_slices == 0)
        return end(NVML_ERROR_NOT_SUPPORTED);
    int profile = gi_profile_by_id(gpu, id);
    if (profile < 0)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    const mock_gi_profile_t *p = &gpu->gi_profile[profile];
    for (int s = 0; placements != NULL && s < p->starts; s++)
        placements[s] = (nvmlPlacement_t){p->start[s], p->memory_slices};
    *count = (unsigned int)p->starts;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int id,
                                                                  nvmlPlacement_t *placements, unsigned int *count)
{
    ENTER("nvmlDeviceGetGpuInstancePossiblePlacements_v2");
    return gi_placements(device, id, placements, count);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(nvmlDevice_t device, unsigned int id,
                                                               nvmlPlacement_t *placements, unsigned int *count)
{
    ENTER("nvmlDeviceGetGpuInstancePossiblePlacements");
    return gi_placements(device, id, placements, count);
}

/* Locks and resolves a GPU in MIG mode and NVIDIA's profile ID for a GPU-instance call. */
static nvmlReturn_t begin_gi_call(nvmlDevice_t device, unsigned int id, const void *out, mock_gpu_t **gpu,
                                  int *profile)
{
    nvmlReturn_t rc = begin_device(device, gpu);
    if (rc)
        return rc;
    if (out == NULL || as_mig(device))
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if ((*gpu)->mig_mode < 0 || !(*gpu)->mig.current)
        return end(NVML_ERROR_NOT_SUPPORTED);
    *profile = gi_profile_by_id(*gpu, id);
    if (*profile < 0)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device, unsigned int id,
                                                              unsigned int *count)
{
    ENTER("nvmlDeviceGetGpuInstanceRemainingCapacity");
    mock_gpu_t *gpu;
    int profile;
    nvmlReturn_t rc = begin_gi_call(device, id, count, &gpu, &profile);
    if (rc)
        return rc;
    /* Fill the GPU with this profile alone, as the driver would place each. */
    mock_mig_t scratch = gpu->mig;
    unsigned int n = 0;
    for (int start; (start = choose_gi_start(gpu, &scratch, profile)) >= 0; n++) {
        int g = gi_id_of(gpu, (unsigned int)start, gpu->gi_profile[profile].memory_slices);
        if (g < 0)
            break;
        scratch.gi[g] = (mock_gi_t){.live = 1, .profile = (unsigned int)profile, .start = (unsigned int)start,
                                    .size = gpu->gi_profile[profile].memory_slices};
    }
    *count = n;
    return end(NVML_SUCCESS);
}

/* ---- MIG: creating and destroying GPU instances --------------------------------------------------------- */
static nvmlReturn_t create_gpu_instance(nvmlDevice_t device, unsigned int id, const nvmlPlacement_t *placement,
                                        nvmlGpuInstance_t *instance)
{
    mock_gpu_t *gpu;
    int profile;
    nvmlReturn_t rc = begin_gi_call(device, id, instance, &gpu, &profile);
    if (rc)
        return rc;
    const mock_gi_profile_t *p = &gpu->gi_profile[profile];
    if (placement != NULL) {
        int known = 0;
        for (int s = 0; s < p->starts; s++)
            known |= p->start[s] == placement->start;
        if (!known || placement->size != p->memory_slices)
            return end(NVML_ERROR_INVALID_ARGUMENT);
    }
    rc = layout_begin();
    if (rc)
        return end(rc);
    mock_mig_t next = gpu->mig;
    int start = placement ? (gi_fits(gpu, &next, profile, placement->start) ? (int)placement->start : -1)
                          : choose_gi_start(gpu, &next, profile);
    int g = start < 0 ? -1 : gi_id_of(gpu, (unsigned int)start, p->memory_slices);
    if (!next.current || g < 0 || next.gi[g].live) {
        layout_end();
        return end(next.current ? NVML_ERROR_INSUFFICIENT_RESOURCES : NVML_ERROR_NOT_SUPPORTED);
    }
    next.gi[g] = (mock_gi_t){.live = 1, .profile = (unsigned int)profile, .start = (unsigned int)start,
                             .size = p->memory_slices};
    rc = layout_commit(gpu, &next);
    if (rc == NVML_SUCCESS)
        *instance = &gpu->mig.gi[g].instance;
    return end(rc);
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *instance)
{
    ENTER("nvmlDeviceCreateGpuInstance");
    return create_gpu_instance(device, id, NULL, instance);
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int id,
                                                             const nvmlPlacement_t *placement,
                                                             nvmlGpuInstance_t *instance)
{
    ENTER("nvmlDeviceCreateGpuInstanceWithPlacement");
    if (placement == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return create_gpu_instance(device, id, placement, instance);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *instances,
                                              unsigned int *count)
{
    ENTER("nvmlDeviceGetGpuInstances");
    mock_gpu_t *gpu;
    int profile;
    nvmlReturn_t rc = begin_gi_call(device, id, instances, &gpu, &profile);
    if (rc)
        return rc;
    if (count == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int n = 0;
    for (int g = 0; g < MAX_GI; g++)
        if (gpu->mig.gi[g].live && gpu->mig.gi[g].profile == (unsigned int)profile)
            instances[n++] = &gpu->mig.gi[g].instance;
    *count = n;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *instance)
{
    ENTER("nvmlDeviceGetGpuInstanceById");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (instance == NULL || as_mig(device))
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (gpu->mig_mode < 0 || !gpu->mig.current)
        return end(NVML_ERROR_NOT_SUPPORTED);
    if (id >= MAX_GI || !gpu->mig.gi[id].live)
        return end(NVML_ERROR_NOT_FOUND);
    *instance = &gpu->mig.gi[id].instance;
    return end(NVML_SUCCESS);
}

/* Locks and resolves a GPU- or compute-instance handle (a destroyed one is no longer valid).
 * Returns with the lock held only on success. */
static nvmlReturn_t begin_instance(struct mock_instance *instance, int compute, mock_gpu_t **gpu, mock_gi_t **gi,
                                   mock_ci_t **ci)
{
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = ready_locked();
    if (rc)
        return end(rc);
    if (instance == NULL || instance->gpu < 0 || instance->gpu >= state.count || instance->gi < 0 ||
        instance->gi >= MAX_GI || (compute && (instance->ci < 0 || instance->ci >= MAX_CI)) ||
        (!compute && instance->ci != -1))
        return end(NVML_ERROR_INVALID_ARGUMENT);
    *gpu = &state.gpu[instance->gpu];
    *gi = &(*gpu)->mig.gi[instance->gi];
    *ci = compute ? &(*gi)->ci[instance->ci] : NULL;
    if (instance != (compute ? &(*ci)->instance : &(*gi)->instance) || !(*gpu)->mig.current || !(*gi)->live ||
        (compute && !(*ci)->live))
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if ((*gpu)->lost)
        return end(NVML_ERROR_GPU_IS_LOST);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t instance, nvmlGpuInstanceInfo_t *info)
{
    ENTER("nvmlGpuInstanceGetInfo");
    mock_gpu_t *gpu;
    mock_gi_t *gi;
    mock_ci_t *ci;
    nvmlReturn_t rc = begin_instance(instance, 0, &gpu, &gi, &ci);
    if (rc)
        return rc;
    if (info == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    info->device = &gpu->handle;
    info->id = (unsigned int)instance->gi;
    info->profileId = gpu->gi_profile[gi->profile].id;
    info->placement = (nvmlPlacement_t){gi->start, gi->size};
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t instance)
{
    ENTER("nvmlGpuInstanceDestroy");
    mock_gpu_t *gpu;
    mock_gi_t *gi;
    mock_ci_t *ci;
    nvmlReturn_t rc = begin_instance(instance, 0, &gpu, &gi, &ci);
    if (rc)
        return rc;
    int g = instance->gi;
    rc = layout_begin();
    if (rc)
        return end(rc);
    mock_mig_t next = gpu->mig;
    if (!next.gi[g].live) {
        layout_end(); /* another process destroyed it meanwhile */
        return end(NVML_ERROR_INVALID_ARGUMENT);
    }
    for (int c = 0; c < MAX_CI; c++) {
        if (next.gi[g].ci[c].live) {
            layout_end(); /* nvml.h: compute instances active on it */
            return end(NVML_ERROR_IN_USE);
        }
    }
    memset(&next.gi[g], 0, sizeof next.gi[g]);
    return end(layout_commit(gpu, &next));
}

/* ---- MIG: compute instances ---------------------------------------------------------------------------- */
static const mock_ci_profile_t *ci_profile_of(const mock_gpu_t *gpu, const mock_gi_t *gi, unsigned int profile)
{
    return profile < CI_PROFILES && gpu->ci_profile[gi->profile][profile].offered ? &gpu->ci_profile[gi->profile][profile]
                                                                                  : NULL;
}

static int ci_fits(const mock_gi_t *gi, unsigned int profile, const mock_ci_profile_t *p, unsigned int start)
{
    unsigned int same = 0;
    for (int c = 0; c < MAX_CI; c++) {
        if (!gi->ci[c].live)
            continue;
        if (overlaps(gi->ci[c].start, gi->ci[c].size, start, p->slices))
            return 0;
        same += gi->ci[c].profile == profile;
    }
    return same < p->instances;
}

static void fill_ci_profile(const mock_gpu_t *gpu, const mock_gi_t *gi, unsigned int profile, unsigned int *id,
                            unsigned int *slices, unsigned int *instances, unsigned int *sm, unsigned int *ce,
                            unsigned int *dec, unsigned int *enc, unsigned int *jpeg, unsigned int *ofa)
{
    const mock_gi_profile_t *gp = &gpu->gi_profile[gi->profile];
    const mock_ci_profile_t *p = &gpu->ci_profile[gi->profile][profile];
    *id = profile;
    *slices = p->slices;
    *instances = p->instances;
    *sm = p->sm;
    *ce = gp->ce;
    *dec = gp->dec;
    *enc = gp->enc;
    *jpeg = gp->jpeg;
    *ofa = gp->ofa;
}

/* The profile as NVIDIA names it: 3g.40gb for a compute instance as large as its GPU instance, 1c.3g.40gb. */
static void ci_profile_name(const mock_gpu_t *gpu, const mock_gi_t *gi, unsigned int profile, char *name,
                            size_t size)
{
    const mock_gi_profile_t *gp = &gpu->gi_profile[gi->profile];
    unsigned int slices = gpu->ci_profile[gi->profile][profile].slices;
    if (slices == gp->slices)
        snprintf(name, size, "%s", gp->name);
    else
        snprintf(name, size, "%uc.%s", slices, gp->name);
}

/* Locks and resolves a GPU instance and a compute-instance profile: INVALID_ARGUMENT past the enumeration
 * (or an engine profile other than the shared one), NOT_SUPPORTED where this GPU instance does not offer it. */
static nvmlReturn_t begin_ci_profile(nvmlGpuInstance_t instance, unsigned int profile, unsigned int engine,
                                     const void *out, mock_gpu_t **gpu, mock_gi_t **gi)
{
    mock_ci_t *unused;
    nvmlReturn_t rc = begin_instance(instance, 0, gpu, gi, &unused);
    if (rc)
        return rc;
    if (out == NULL || profile >= CI_PROFILES || engine != 0)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (ci_profile_of(*gpu, *gi, profile) == NULL)
        return end(NVML_ERROR_NOT_SUPPORTED);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t instance, unsigned int profile,
                                                                 unsigned int engine,
                                                                 nvmlComputeInstanceProfileInfo_t *info)
{
    ENTER("nvmlGpuInstanceGetComputeInstanceProfileInfo");
    mock_gpu_t *gpu;
    mock_gi_t *gi;
    nvmlReturn_t rc = begin_ci_profile(instance, profile, engine, info, &gpu, &gi);
    if (rc)
        return rc;
    memset(info, 0, sizeof *info);
    fill_ci_profile(gpu, gi, profile, &info->id, &info->sliceCount, &info->instanceCount, &info->multiprocessorCount,
                    &info->sharedCopyEngineCount, &info->sharedDecoderCount, &info->sharedEncoderCount,
                    &info->sharedJpegCount, &info->sharedOfaCount);
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t instance, unsigned int profile,
                                                                  unsigned int engine, void *out)
{
    ENTER("nvmlGpuInstanceGetComputeInstanceProfileInfoV");
    mock_gpu_t *gpu;
    mock_gi_t *gi;
    nvmlReturn_t rc = begin_ci_profile(instance, profile, engine, out, &gpu, &gi);
    if (rc)
        return rc;
    unsigned int version = *(unsigned int *)out;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE], short_name[NAME_TEXT];
    ci_profile_name(gpu, gi, profile, short_name, sizeof short_name);
    snprintf(name, sizeof name, "MIG %s", short_name);
    if (version == CI_INFO_V2) {
        nvmlComputeInstanceProfileInfo_v2_t *info = out;
        memset(info, 0, sizeof *info);
        info->version = version;
        fill_ci_profile(gpu, gi, profile, &info->id, &info->sliceCount, &info->instanceCount,
                        &info->multiprocessorCount, &info->sharedCopyEngineCount, &info->sharedDecoderCount,
                        &info->sharedEncoderCount, &info->sharedJpegCount, &info->sharedOfaCount);
        copy_text(info->name, sizeof info->name, name);
        return end(NVML_SUCCESS);
    }
    if (version == CI_INFO_V3) {
        nvmlComputeInstanceProfileInfo_v3_t *info = out;
        memset(info, 0, sizeof *info);
        info->version = version;
        fill_ci_profile(gpu, gi, profile, &info->id, &info->sliceCount, &info->instanceCount,
                        &info->multiprocessorCount, &info->sharedCopyEngineCount, &info->sharedDecoderCount,
                        &info->sharedEncoderCount, &info->sharedJpegCount, &info->sharedOfaCount);
        copy_text(info->name, sizeof info->name, name);
        return end(NVML_SUCCESS);
    }
    return end(NVML_ERROR_INVALID_ARGUMENT);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(nvmlGpuInstance_t instance,
                                                                        unsigned int profile,
                                                                        nvmlPlacement_t *placements,
                                                                        unsigned int *count)
{
    ENTER("nvmlGpuInstanceGetComputeInstancePossiblePlacements");
    mock_gpu_t *gpu;
    mock_gi_t *gi;
    nvmlReturn_t rc = begin_ci_profile(instance, profile, 0, count, &gpu, &gi);
    if (rc)
        return rc;
    const mock_ci_profile_t *p = ci_profile_of(gpu, gi, profile);
    for (int s = 0; placements != NULL && s < p->starts; s++)
        placements[s] = (nvmlPlacement_t){p->start[s], p->slices};
    *count = (unsigned int)p->starts;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t instance,
                                                                       unsigned int profile, unsigned int *count)
{
    ENTER("nvmlGpuInstanceGetComputeInstanceRemainingCapacity");
    mock_gpu_t *gpu;
    mock_gi_t *gi;
    nvmlReturn_t rc = begin_ci_profile(instance, profile, 0, count, &gpu, &gi);
    if (rc)
        return rc;
    const mock_ci_profile_t *p = ci_profile_of(gpu, gi, profile);
    mock_gi_t scratch = *gi;
    unsigned int n = 0;
    for (int s = 0; s < p->starts; s++) {
        if (!ci_fits(&scratch, profile, p, p->start[s]))
            continue;
        for (int c = 0; c < MAX_CI; c++) {
            if (!scratch.ci[c].live) {
                scratch.ci[c] = (mock_ci_t){.live = 1, .profile = profile, .start = p->start[s], .size = p->slices};
                n++;
                break;
            }
        }
    }
    *count = n;
    return end(NVML_SUCCESS);
}

/* Where a compute instance created without a placement goes: as for GPU instances, the free placement
 * that takes away the fewest placements still possible in its GPU instance (a 1c in a 3g takes the last
 * slice, which leaves room for a 2c), the lowest first among equals. -1: none fits. */
static int choose_ci_start(const mock_gpu_t *gpu, const mock_gi_t *gi, unsigned int profile)
{
    const mock_ci_profile_t *p = &gpu->ci_profile[gi->profile][profile];
    int best = -1;
    unsigned int best_taken = 0;
    for (int s = 0; s < p->starts; s++) {
        if (!ci_fits(gi, profile, p, p->start[s]))
            continue;
        unsigned int taken = 0;
        for (unsigned int q = 0; q < CI_PROFILES; q++) {
            const mock_ci_profile_t *other = &gpu->ci_profile[gi->profile][q];
            for (int t = 0; other->offered && t < other->starts; t++)
                taken += ci_fits(gi, q, other, other->start[t]) &&
                         overlaps(other->start[t], other->slices, p->start[s], p->slices);
        }
        if (best < 0 || taken < best_taken) {
            best = (int)p->start[s];
            best_taken = taken;
        }
    }
    return best;
}

/* A new UUID for every compute instance created (as a real one gets): from the GPU, the instance and a count. */
static void new_mig_uuid(const mock_gpu_t *gpu, int g, int c, unsigned long serial, char *out, size_t size)
{
    unsigned long long h1 = 1469598103934665603ULL, h2 = 1099511628211ULL * 7;
    char text[TEXT + 64];
    snprintf(text, sizeof text, "%s/%d/%d/%lu", gpu->uuid, g, c, serial);
    for (const char *p = text; *p; p++) {
        h1 = (h1 ^ (unsigned char)*p) * 1099511628211ULL;
        h2 = (h2 ^ (unsigned char)*p) * 1469598103934665603ULL;
    }
    snprintf(out, size, "MIG-%08llx-%04llx-5%03llx-8%03llx-%012llx", h1 >> 32, (h1 >> 16) & 0xFFFF, h1 & 0xFFF,
             (h2 >> 52) & 0xFFF, h2 & 0xFFFFFFFFFFFFULL);
}

static nvmlReturn_t create_compute_instance(nvmlGpuInstance_t instance, unsigned int profile,
                                            const nvmlPlacement_t *placement, nvmlComputeInstance_t *out)
{
    mock_gpu_t *gpu;
    mock_gi_t *gi;
    nvmlReturn_t rc = begin_ci_profile(instance, profile, 0, out, &gpu, &gi);
    if (rc)
        return rc;
    const mock_ci_profile_t *p = ci_profile_of(gpu, gi, profile);
    if (placement != NULL) {
        int known = 0;
        for (int s = 0; s < p->starts; s++)
            known |= p->start[s] == placement->start;
        if (!known || placement->size != p->slices)
            return end(NVML_ERROR_INVALID_ARGUMENT);
    }
    int g = instance->gi;
    rc = layout_begin();
    if (rc)
        return end(rc);
    mock_mig_t next = gpu->mig;
    mock_gi_t *target = &next.gi[g];
    int start = -1, c = -1;
    if (target->live)
        start = placement ? (ci_fits(target, profile, p, placement->start) ? (int)placement->start : -1)
                          : choose_ci_start(gpu, target, profile);
    for (int i = 0; start >= 0 && i < MAX_CI && c < 0; i++)
        if (!target->ci[i].live)
            c = i;
    if (!target->live || start < 0 || c < 0) {
        layout_end();
        return end(target->live ? NVML_ERROR_INSUFFICIENT_RESOURCES : NVML_ERROR_INVALID_ARGUMENT);
    }
    mock_ci_t *ci = &target->ci[c];
    *ci = (mock_ci_t){.live = 1, .profile = profile, .start = (unsigned int)start, .size = p->slices,
                      .memory_mib = gpu->gi_profile[target->profile].memory_mib};
    next.serial++;
    new_mig_uuid(gpu, g, c, next.serial, ci->uuid, sizeof ci->uuid);
    ci_profile_name(gpu, target, profile, ci->name, sizeof ci->name);
    rc = layout_commit(gpu, &next);
    if (rc == NVML_SUCCESS)
        *out = &gpu->mig.gi[g].ci[c].instance;
    return end(rc);
}

EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t instance, unsigned int profile,
                                                         nvmlComputeInstance_t *out)
{
    ENTER("nvmlGpuInstanceCreateComputeInstance");
    return create_compute_instance(instance, profile, NULL, out);
}

EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstanceWithPlacement(nvmlGpuInstance_t instance,
                                                                      unsigned int profile,
                                                                      const nvmlPlacement_t *placement,
                                                                      nvmlComputeInstance_t *out)
{
    ENTER("nvmlGpuInstanceCreateComputeInstanceWithPlacement");
    if (placement == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return create_compute_instance(instance, profile, placement, out);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t instance, unsigned int profile,
                                                       nvmlComputeInstance_t *instances, unsigned int *count)
{
    ENTER("nvmlGpuInstanceGetComputeInstances");
    mock_gpu_t *gpu;
    mock_gi_t *gi;
    nvmlReturn_t rc = begin_ci_profile(instance, profile, 0, instances, &gpu, &gi);
    if (rc)
        return rc;
    if (count == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int n = 0;
    for (int c = 0; c < MAX_CI; c++)
        if (gi->ci[c].live && gi->ci[c].profile == profile)
            instances[n++] = &gi->ci[c].instance;
    *count = n;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t instance, unsigned int id,
                                                          nvmlComputeInstance_t *compute)
{
    ENTER("nvmlGpuInstanceGetComputeInstanceById");
    mock_gpu_t *gpu;
    mock_gi_t *gi;
    mock_ci_t *unused;
    nvmlReturn_t rc = begin_instance(instance, 0, &gpu, &gi, &unused);
    if (rc)
        return rc;
    if (compute == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (id >= MAX_CI || !gi->ci[id].live)
        return end(NVML_ERROR_NOT_FOUND);
    *compute = &gi->ci[id].instance;
    return end(NVML_SUCCESS);
}

static nvmlReturn_t compute_instance_info(nvmlComputeInstance_t instance, nvmlComputeInstanceInfo_t *info)
{
    mock_gpu_t *gpu;
    mock_gi_t *gi;
    mock_ci_t *ci;
    nvmlReturn_t rc = begin_instance(instance, 1, &gpu, &gi, &ci);
    if (rc)
        return rc;
    if (info == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    info->device = &gpu->handle;
    info->gpuInstance = &gi->instance;
    info->id = (unsigned int)instance->ci;
    info->profileId = ci->profile;
    info->placement = (nvmlPlacement_t){ci->start, ci->size};
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t instance, nvmlComputeInstanceInfo_t *info)
{
    ENTER("nvmlComputeInstanceGetInfo_v2");
    return compute_instance_info(instance, info);
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t instance, nvmlComputeInstanceInfo_t *info)
{
    ENTER("nvmlComputeInstanceGetInfo");
    return compute_instance_info(instance, info);
}

EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t instance)
{
    ENTER("nvmlComputeInstanceDestroy");
    mock_gpu_t *gpu;
    mock_gi_t *gi;
    mock_ci_t *ci;
    nvmlReturn_t rc = begin_instance(instance, 1, &gpu, &gi, &ci);
    if (rc)
        return rc;
    int g = instance->gi, c = instance->ci;
    rc = layout_begin();
    if (rc)
        return end(rc);
    mock_mig_t next = gpu->mig;
    if (!next.gi[g].live || !next.gi[g].ci[c].live) {
        layout_end(); /* another process destroyed it meanwhile */
        return end(NVML_ERROR_INVALID_ARGUMENT);
    }
    memset(&next.gi[g].ci[c], 0, sizeof next.gi[g].ci[c]);
    return end(layout_commit(gpu, &next));
}

/* ---- the reset a test or lab asks for (not NVML's: NVML has no call that resets a GPU) ---------------- */
/*
 * gpuopsMockNvmlResetGpu(uuid, force): what `nvidia-smi --gpu-reset` does to a GPU's MIG state: the
 * pending MIG mode becomes current and every GPU instance is gone. Like that reset, it answers
 * NVML_ERROR_IN_USE while another process has NVML initialised or the GPU is in persistence mode, unless
 * `force` (a reboot). Needs no nvmlInit; NVML_ERROR_NOT_FOUND for a UUID the state does not have.
 */
EXPORT nvmlReturn_t gpuopsMockNvmlResetGpu(const char *uuid, unsigned int force)
{
    ENTER("gpuopsMockNvmlResetGpu");
    pthread_mutex_lock(&lock);
    if (refresh_locked() != 0)
        return end(NVML_ERROR_DRIVER_NOT_LOADED);
    if (uuid == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    mock_gpu_t *gpu = NULL;
    for (int i = 0; i < state.count; i++)
        if (strcmp(state.gpu[i].uuid, uuid) == 0)
            gpu = &state.gpu[i];
    if (gpu == NULL)
        return end(NVML_ERROR_NOT_FOUND);
    if (!force && (other_clients() || gpu->persistence))
        return end(NVML_ERROR_IN_USE);
    nvmlReturn_t rc = layout_begin();
    if (rc)
        return end(rc);
    mock_mig_t next = gpu->mig;
    memset(next.gi, 0, sizeof next.gi);
    next.current = next.pending;
    return end(layout_commit(gpu, &next));
}

/* ---- events --------------------------------------------------------------------------------------- */
typedef struct {
    int registered[MAX_GPUS];
    unsigned long long types[MAX_GPUS];
    unsigned long seen_generation[MAX_GPUS];
    int seen_lost[MAX_GPUS];
    char uuid[MAX_GPUS][TEXT]; /* who was registered, so a reordered state still finds them */
} mock_event_set_t;

typedef mock_event_set_t *nvmlEventSet_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    ENTER("nvmlEventSetCreate");
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = ready_locked();
    if (rc)
        return end(rc);
    if (set == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    *set = calloc(1, sizeof(mock_event_set_t));
    return end(*set ? NVML_SUCCESS : NVML_ERROR_MEMORY);
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set)
{
    ENTER("nvmlDeviceRegisterEvents");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (set == NULL || as_mig(device))
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (types & ~NVML_SUPPORTED_EVENTS)
        return end(NVML_ERROR_NOT_SUPPORTED);
    int i = gpu->handle.index;
    set->registered[i] = 1;
    set->types[i] |= types;
    /* Like NVML, an event set hears of what happens after it registered, not before. */
    set->seen_generation[i] = gpu->xid_generation;
    set->seen_lost[i] = gpu->lost;
    copy_text(set->uuid[i], sizeof set->uuid[i], gpu->uuid);
    return end(NVML_SUCCESS);
}

/* One pending event of the set, or NVML_ERROR_TIMEOUT. Locked. */
static nvmlReturn_t next_event_locked(nvmlEventSet_t set, nvmlEventData_t *data)
{
    for (int i = 0; i < MAX_GPUS; i++) {
        if (!set->registered[i])
            continue;
        mock_gpu_t *gpu = NULL;
        for (int j = 0; j < state.count; j++)
            if (strcmp(state.gpu[j].uuid, set->uuid[i]) == 0)
                gpu = &state.gpu[j];
        if (gpu == NULL)
            continue;
        if (gpu->lost != set->seen_lost[i]) {
            set->seen_lost[i] = gpu->lost;
            if (gpu->lost)
                return NVML_ERROR_GPU_IS_LOST;
        }
        if (gpu->xid_generation != set->seen_generation[i]) {
            set->seen_generation[i] = gpu->xid_generation;
            if (gpu->xid != 0 && (set->types[i] & NVML_EVENT_TYPE_XID_CRITICAL_ERROR)) {
                data->device = &gpu->handle;
                data->eventType = NVML_EVENT_TYPE_XID_CRITICAL_ERROR;
                data->eventData = gpu->xid;
                data->gpuInstanceId = 0xFFFFFFFFu;
                data->computeInstanceId = 0xFFFFFFFFu;
                return NVML_SUCCESS;
            }
        }
    }
    return NVML_ERROR_TIMEOUT;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms)
{
    ENTER("nvmlEventSetWait_v2");
    if (set == NULL || data == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        pthread_mutex_lock(&lock);
        nvmlReturn_t rc = ready_locked();
        if (rc == NVML_SUCCESS)
            rc = next_event_locked(set, data);
        pthread_mutex_unlock(&lock);
        if (rc != NVML_ERROR_TIMEOUT)
            return rc;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long elapsed = (now.tv_sec - start.tv_sec) * 1000LL + (now.tv_nsec - start.tv_nsec) / 1000000LL;
        if (elapsed >= (long long)timeout_ms)
            return NVML_ERROR_TIMEOUT;
        struct timespec pause = {0, 20 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms)
{
    ENTER("nvmlEventSetWait");
    return nvmlEventSetWait_v2(set, data, timeout_ms);
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    ENTER("nvmlEventSetFree");
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = ready_locked();
    if (rc)
        return end(rc);
    if (set == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    free(set);
    return end(NVML_SUCCESS);
}
