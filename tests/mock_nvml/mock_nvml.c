/*
 * A mock libnvidia-ml.so.1 for labs and CI: NVML's C ABI (its struct layouts, versioned symbols and
 * error codes) answering from a state file, so that the real nvidia-ml-py bindings, and any other
 * NVML client, run unchanged on a machine without a GPU. TEST DOUBLE: nothing here talks to hardware.
 *
 * One source of truth: the state file is written from a simulated-GPU spec by the spec reader
 * (plugins/module_utils/_simulated_spec.py, nvml_state_text; tests/mock_nvml/nvml_state.py writes
 * it). This library parses only that line format, never YAML.
 *
 * Where the state is: $GPUOPS_MOCK_NVML_STATE, else gpuops-mock-nvml.state in the directory this
 * library was loaded from (so a driver root mounted elsewhere still finds its own state).
 * The state is re-read whenever the file changes (checked on every call, and every 20 ms while
 * nvmlEventSetWait waits): a GPU whose `xid` changes delivers an XID event to the event sets that
 * registered for it; a GPU that becomes `lost` answers NVML_ERROR_GPU_IS_LOST.
 *
 * Test knobs (never set on a node): $GPUOPS_MOCK_NVML_FAIL="fnA:code,fnB:code" makes those
 * functions return that NVML error; $GPUOPS_MOCK_NVML_TRACE=FILE appends each function's name
 * to FILE as it is called.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
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
#define MAX_MIG 8
#define MAX_LINKS NVML_NVLINK_MAX_LINKS
#define TEXT 96

struct mock_device;
typedef struct mock_device *nvmlDevice_t;

/* A handle points at one of these; the first field tells a GPU from a MIG device. */
struct mock_device {
    int is_mig;
    int index;        /* the GPU's index; for a MIG device, its slot on the parent */
    int parent;       /* MIG: the parent GPU's index */
};

/* A GPU instance or compute instance handle: which MIG device of which GPU it stands for. */
struct mock_instance {
    int gpu, mig, compute;
};

typedef struct {
    struct mock_device handle;
    char uuid[TEXT];
    char profile[32];
    unsigned long long memory_mib;
    unsigned int gi_slices, ci_slices, gi_id, ci_id, gi_profile, ci_profile;
    struct mock_instance gpu_instance, compute_instance;
} mock_mig_t;

typedef struct {
    struct mock_device handle;
    char uuid[TEXT], name[TEXT], serial[TEXT], bus_id[32], pcie_switch[32];
    unsigned int domain, bus, device, function, pci_device_id, pci_subsystem_id;
    unsigned long long memory_mib;
    int cc_major, cc_minor, numa_node, persistence, minor_number;
    int mig_mode; /* 0 disabled, 1 enabled, -1 unsupported */
    int architecture, brand;
    int lost;
    unsigned long long xid;
    unsigned long xid_generation; /* bumped whenever the xid value changes */
    int links, link_peer[MAX_LINKS];
    unsigned long cpu_affinity[4];
    unsigned int temperature_c, power_mw, power_limit_mw, util_gpu, util_memory;
    unsigned int clock_graphics, clock_sm, clock_memory, clock_video;
    unsigned long long ecc_corrected, ecc_uncorrected;
    int mig_count;
    mock_mig_t mig[MAX_MIG];
} mock_gpu_t;

typedef struct {
    int valid;
    char driver_version[80];
    int cuda_version;
    char nvml_version[80];
    int count;
    mock_gpu_t gpu[MAX_GPUS];
} mock_state_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static mock_state_t state;
static int refcount;
static char state_path[PATH_MAX];
static struct timespec state_mtime;
static ino_t state_ino;
static off_t state_size;

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

/* The NVML error a test asked this function to return, or NVML_SUCCESS. */
static nvmlReturn_t injected(const char *name)
{
    const char *spec = getenv("GPUOPS_MOCK_NVML_FAIL");
    if (spec == NULL)
        return NVML_SUCCESS;
    size_t len = strlen(name);
    for (const char *p = spec; *p;) {
        const char *end = strchr(p, ',');
        size_t item = end ? (size_t)(end - p) : strlen(p);
        if (item > len && strncmp(p, name, len) == 0 && p[len] == ':')
            return (nvmlReturn_t)atoi(p + len + 1);
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

/* ---- reading the state file ------------------------------------------------------------------- */
static void find_state_path(void)
{
    const char *env = getenv("GPUOPS_MOCK_NVML_STATE");
    if (env && *env) {
        snprintf(state_path, sizeof state_path, "%s", env);
        return;
    }
    Dl_info info;
    if (dladdr((void *)find_state_path, &info) && info.dli_fname) {
        char dir[PATH_MAX - 32];
        snprintf(dir, sizeof dir, "%s", info.dli_fname);
        char *slash = strrchr(dir, '/');
        if (slash) {
            *slash = '\0';
            snprintf(state_path, sizeof state_path, "%s/gpuops-mock-nvml.state", dir);
            return;
        }
    }
    snprintf(state_path, sizeof state_path, "gpuops-mock-nvml.state");
}

static void copy_text(char *dst, size_t size, const char *src)
{
    snprintf(dst, size, "%s", src);
}

static int parse_state(FILE *file, mock_state_t *out)
{
    memset(out, 0, sizeof *out);
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
            version_seen = strcmp(value, "gpuops-mock-nvml 1") == 0;
        } else if (strcmp(key, "driver_version") == 0) {
            copy_text(out->driver_version, sizeof out->driver_version, value);
        } else if (strcmp(key, "nvml_version") == 0) {
            copy_text(out->nvml_version, sizeof out->nvml_version, value);
        } else if (strcmp(key, "cuda_driver_version") == 0) {
            out->cuda_version = atoi(value);
        } else if (strcmp(key, "gpu") == 0) {
            if (out->count >= MAX_GPUS)
                return -1;
            gpu = &out->gpu[out->count];
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
            gpu->persistence = atoi(value);
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
        } else if (strcmp(key, "mig") == 0) {
            /* mig <uuid> <memory MiB> <profile> <GI slices> <CI slices> <GI id> <CI id> <GI profile> <CI profile> */
            if (gpu->mig_count >= MAX_MIG)
                return -1;
            mock_mig_t *mig = &gpu->mig[gpu->mig_count];
            if (sscanf(value, "%95s %llu %31s %u %u %u %u %u %u", mig->uuid, &mig->memory_mib, mig->profile,
                       &mig->gi_slices, &mig->ci_slices, &mig->gi_id, &mig->ci_id, &mig->gi_profile,
                       &mig->ci_profile) != 9)
                return -1;
            mig->handle.is_mig = 1;
            mig->handle.index = gpu->mig_count;
            mig->handle.parent = gpu->handle.index;
            mig->gpu_instance = (struct mock_instance){gpu->handle.index, gpu->mig_count, 0};
            mig->compute_instance = (struct mock_instance){gpu->handle.index, gpu->mig_count, 1};
            gpu->mig_count++;
        }
    }
    return version_seen ? 0 : -1;
}

/* Re-read the state when the file changed; keep every event generation that did not change. Locked. */
static int refresh_locked(void)
{
    struct stat st;
    char previous[PATH_MAX];
    copy_text(previous, sizeof previous, state_path);
    find_state_path(); /* the environment may name another file now */
    if (strcmp(previous, state_path) != 0)
        state.valid = 0;
    if (stat(state_path, &st) != 0) {
        state.valid = 0;
        return -1;
    }
    if (state.valid && st.st_ino == state_ino && st.st_size == state_size &&
        st.st_mtim.tv_sec == state_mtime.tv_sec && st.st_mtim.tv_nsec == state_mtime.tv_nsec)
        return 0;
    FILE *file = fopen(state_path, "re");
    if (file == NULL) {
        state.valid = 0;
        return -1;
    }
    static mock_state_t fresh;
    int parsed = parse_state(file, &fresh);
    fclose(file);
    if (parsed != 0)
        return state.valid ? 0 : -1; /* a half-written or foreign file: keep what was read before */
    for (int i = 0; i < fresh.count; i++) {
        mock_gpu_t *gpu = &fresh.gpu[i];
        const mock_gpu_t *old = NULL;
        for (int j = 0; state.valid && j < state.count; j++)
            if (strcmp(state.gpu[j].uuid, gpu->uuid) == 0)
                old = &state.gpu[j];
        gpu->xid_generation = old ? old->xid_generation + (old->xid != gpu->xid) : (gpu->xid ? 1 : 0);
    }
    /* Copy field by field into the live state: handles point into it and must stay valid. */
    memcpy(&state, &fresh, sizeof state);
    state.valid = 1;
    state_ino = st.st_ino;
    state_size = st.st_size;
    state_mtime = st.st_mtim;
    return 0;
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

static mock_mig_t *as_mig(nvmlDevice_t device)
{
    if (device == NULL || !device->is_mig || device->parent < 0 || device->parent >= state.count)
        return NULL;
    mock_gpu_t *gpu = &state.gpu[device->parent];
    if (device->index >= gpu->mig_count || &gpu->mig[device->index].handle != device)
        return NULL;
    return &gpu->mig[device->index];
}

/* The physical GPU behind a handle (a MIG device's parent), or NULL for a handle that is no device. */
static mock_gpu_t *gpu_of(nvmlDevice_t device)
{
    if (is_gpu_handle(device))
        return &state.gpu[device->index];
    if (as_mig(device))
        return &state.gpu[device->parent];
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
    refcount++;
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
    refcount--;
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
        for (int m = 0; m < gpu->mig_count; m++) {
            if (strcmp(gpu->mig[m].uuid, uuid) == 0) {
                *device = &gpu->mig[m].handle;
                return end(gpu->lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS);
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
    mock_mig_t *mig = as_mig(device);
    return end(put_text(uuid, length, mig ? mig->uuid : gpu->uuid));
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    ENTER("nvmlDeviceGetName");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    mock_mig_t *mig = as_mig(device);
    char text[TEXT + 48];
    if (mig)
        snprintf(text, sizeof text, "%s MIG %s", gpu->name, mig->profile);
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
    mock_mig_t *mig = as_mig(device);
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
    memory->total = total;
    memory->used = 0;
    memory->free = total;
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
    /* NVML reserves a little for the driver; the mock reserves nothing. */
    memory->total = total;
    memory->reserved = 0;
    memory->used = 0;
    memory->free = total;
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

/* ---- MIG -------------------------------------------------------------------------------------- */
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
    *current = *pending = (unsigned int)gpu->mig_mode;
    return end(NVML_SUCCESS);
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
    *count = gpu->mig_mode < 0 ? 0 : 7;
    return end(NVML_SUCCESS);
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
    if (gpu->mig_mode != 1)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (index >= 7)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (index >= (unsigned int)gpu->mig_count)
        return end(NVML_ERROR_NOT_FOUND);
    *mig_device = &gpu->mig[index].handle;
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
    mock_mig_t *mig = as_mig(device);
    if (id == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (mig == NULL)
        return end(NVML_ERROR_NOT_SUPPORTED);
    *id = compute ? mig->ci_id : mig->gi_id;
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
    mock_mig_t *mig = as_mig(device);
    memset(attributes, 0, sizeof *attributes);
    unsigned int slices = mig ? mig->gi_slices : 7;
    /* Per slice of seven: the share of an H100's 132 SMs and of its engines, rounded down. */
    attributes->multiprocessorCount = mig ? 132 * slices / 7 : 132;
    attributes->sharedCopyEngineCount = mig ? slices : 7;
    attributes->sharedDecoderCount = mig ? slices : 7;
    attributes->sharedJpegCount = mig ? slices : 7;
    attributes->sharedOfaCount = mig ? (slices == 7) : 1;
    attributes->gpuInstanceSliceCount = slices;
    attributes->computeInstanceSliceCount = mig ? mig->ci_slices : 7;
    attributes->memorySizeMB = mig ? mig->memory_mib : gpu->memory_mib;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    ENTER("nvmlDeviceGetAttributes");
    return nvmlDeviceGetAttributes_v2(device, attributes);
}

/* Changing MIG layouts (GPU- and compute-instance management) belongs to nvidia_mig; until then, Not Supported. */
#define NOT_SUPPORTED_FUNCTION(name, ...)                \
    EXPORT nvmlReturn_t name(__VA_ARGS__)                \
    {                                                    \
        ENTER(#name);                                    \
        pthread_mutex_lock(&lock);                       \
        nvmlReturn_t rc = ready_locked();                \
        return end(rc ? rc : NVML_ERROR_NOT_SUPPORTED);  \
    }

NOT_SUPPORTED_FUNCTION(nvmlDeviceGetGpuInstanceProfileInfoV, nvmlDevice_t d, unsigned int p, void *info)
NOT_SUPPORTED_FUNCTION(nvmlDeviceGetGpuInstances, nvmlDevice_t d, unsigned int p, void *gi, unsigned int *n)
NOT_SUPPORTED_FUNCTION(nvmlDeviceCreateGpuInstance, nvmlDevice_t d, unsigned int p, void *gi)
NOT_SUPPORTED_FUNCTION(nvmlDeviceSetMigMode, nvmlDevice_t d, unsigned int mode, nvmlReturn_t *activation)
NOT_SUPPORTED_FUNCTION(nvmlGpuInstanceGetComputeInstances, void *gi, unsigned int p, void *ci, unsigned int *n)
NOT_SUPPORTED_FUNCTION(nvmlGpuInstanceGetComputeInstanceProfileInfoV, void *gi, unsigned int p, unsigned int e,
                       void *info)
NOT_SUPPORTED_FUNCTION(nvmlDeviceGetComputeRunningProcesses_v3, nvmlDevice_t d, unsigned int *n, void *infos)
NOT_SUPPORTED_FUNCTION(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlDevice_t d, unsigned int *n, void *infos)

/*
 * The existing layout's GPU and compute instances, read-only: what NVIDIA's libraries ask to name a MIG
 * device's profile. Each MIG device of the state is one compute instance in a GPU instance of its own;
 * the profiles a GPU offers are those its MIG devices use (the spec reader gives their NVML profile IDs).
 */
typedef struct mock_instance *nvmlGpuInstance_t;
typedef struct mock_instance *nvmlComputeInstance_t;

typedef struct {
    unsigned int start, size;
} nvmlPlacement_t;

typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount;
    unsigned int decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

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
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id, profileId;
    nvmlPlacement_t placement;
} nvmlComputeInstanceInfo_t;

/* The MIG device an instance handle stands for, with the lock held; NULL for a stale or foreign handle. */
static mock_mig_t *instance_mig(struct mock_instance *instance, int compute)
{
    if (instance == NULL || instance->gpu < 0 || instance->gpu >= state.count)
        return NULL;
    mock_gpu_t *gpu = &state.gpu[instance->gpu];
    if (instance->mig < 0 || instance->mig >= gpu->mig_count)
        return NULL;
    mock_mig_t *mig = &gpu->mig[instance->mig];
    return instance == (compute ? &mig->compute_instance : &mig->gpu_instance) ? mig : NULL;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                        nvmlGpuInstanceProfileInfo_t *info)
{
    ENTER("nvmlDeviceGetGpuInstanceProfileInfo");
    mock_gpu_t *gpu;
    nvmlReturn_t rc = begin_device(device, &gpu);
    if (rc)
        return rc;
    if (info == NULL || as_mig(device))
        return end(NVML_ERROR_INVALID_ARGUMENT);
    for (int m = 0; gpu->mig_mode >= 0 && m < gpu->mig_count; m++) {
        mock_mig_t *mig = &gpu->mig[m];
        if (mig->gi_profile != profile)
            continue;
        memset(info, 0, sizeof *info);
        info->id = profile;
        info->sliceCount = mig->gi_slices;
        info->instanceCount = mig->gi_slices ? 7 / mig->gi_slices : 0;
        info->multiprocessorCount = 132 * mig->gi_slices / 7;
        info->copyEngineCount = mig->gi_slices;
        info->decoderCount = mig->gi_slices;
        info->jpegCount = mig->gi_slices;
        info->memorySizeMB = mig->memory_mib;
        return end(NVML_SUCCESS);
    }
    return end(NVML_ERROR_NOT_SUPPORTED);
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
    if (gpu->mig_mode != 1)
        return end(NVML_ERROR_NOT_SUPPORTED);
    for (int m = 0; m < gpu->mig_count; m++) {
        if (gpu->mig[m].gi_id == id) {
            *instance = &gpu->mig[m].gpu_instance;
            return end(NVML_SUCCESS);
        }
    }
    return end(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t instance, nvmlGpuInstanceInfo_t *info)
{
    ENTER("nvmlGpuInstanceGetInfo");
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = ready_locked();
    if (rc)
        return end(rc);
    mock_mig_t *mig = instance_mig(instance, 0);
    if (mig == NULL || info == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    info->device = &state.gpu[instance->gpu].handle;
    info->id = mig->gi_id;
    info->profileId = mig->gi_profile;
    info->placement = (nvmlPlacement_t){0, mig->gi_slices};
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t instance, unsigned int id,
                                                          nvmlComputeInstance_t *compute)
{
    ENTER("nvmlGpuInstanceGetComputeInstanceById");
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = ready_locked();
    if (rc)
        return end(rc);
    mock_mig_t *mig = instance_mig(instance, 0);
    if (mig == NULL || compute == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (mig->ci_id != id)
        return end(NVML_ERROR_NOT_FOUND);
    *compute = &mig->compute_instance;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t instance, unsigned int profile,
                                                                 unsigned int engine_profile,
                                                                 nvmlComputeInstanceProfileInfo_t *info)
{
    ENTER("nvmlGpuInstanceGetComputeInstanceProfileInfo");
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = ready_locked();
    if (rc)
        return end(rc);
    mock_mig_t *mig = instance_mig(instance, 0);
    if (mig == NULL || info == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (profile != mig->ci_profile || engine_profile != 0)
        return end(NVML_ERROR_NOT_SUPPORTED);
    memset(info, 0, sizeof *info);
    info->id = profile;
    info->sliceCount = mig->ci_slices;
    info->instanceCount = mig->ci_slices ? mig->gi_slices / mig->ci_slices : 0;
    info->multiprocessorCount = 132 * mig->ci_slices / 7;
    info->sharedCopyEngineCount = mig->gi_slices;
    info->sharedDecoderCount = mig->gi_slices;
    info->sharedJpegCount = mig->gi_slices;
    return end(NVML_SUCCESS);
}

static nvmlReturn_t compute_instance_info(nvmlComputeInstance_t instance, nvmlComputeInstanceInfo_t *info)
{
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = ready_locked();
    if (rc)
        return end(rc);
    mock_mig_t *mig = instance_mig(instance, 1);
    if (mig == NULL || info == NULL)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    info->device = &state.gpu[instance->gpu].handle;
    info->gpuInstance = &mig->gpu_instance;
    info->id = mig->ci_id;
    info->profileId = mig->ci_profile;
    info->placement = (nvmlPlacement_t){0, mig->ci_slices};
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
