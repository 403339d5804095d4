/*
 * A fake libnvidia-ml.so for the agent's tests: it exports the NVML functions
 * the agent calls through nvml-wrapper, with the same names (versioned ones
 * included) and C signatures as nvml.h, and reports the GPUs that a scenario
 * file describes. The real nvml-wrapper loads it through
 * `Nvml::builder().lib_path(..)`, so the tests exercise the agent's real NVML
 * code on a machine without a GPU.
 *
 * The scenario file is named by the FAKE_NVML_CONFIG environment variable and
 * read by nvmlInit_v2. One `key = value` per line, `#` starts a comment:
 *
 *   init = ok                  # or driver_not_loaded, no_permission
 *   gpus = 8                   # how many GPUs (at most 16)
 *   driver_version = 550.54.15
 *   cuda_version = 12040       # NVML's encoding: 1000 * major + 10 * minor
 *   gpu.*.name = NVIDIA H200   # a field of every GPU ...
 *   gpu.3.ecc_volatile = 3     # ... or of GPU 3; later lines win
 *   gpu.2.process = 4242:12288 # a process (pid:MiB) holding memory; repeatable
 *
 * Every GPU starts as a healthy, idle NVIDIA H200. Numeric fields also take
 * `unsupported` (the query answers NVML_ERROR_NOT_SUPPORTED) and `error`
 * (NVML_ERROR_UNKNOWN). Fields: name, uuid, serial, memory_total_mib,
 * memory_used_mib, mig, ecc, ecc_volatile, ecc_aggregate, ecc_corrected (corrected
 * errors, the volatile and aggregate counts alike), retired_pending,
 * remap_corrected, remap_uncorrected, remap_pending, remap_failed, throttle
 * (the reason bit mask, e.g. 0x8), sm_clock, sm_clock_max, mem_clock,
 * mem_clock_max, power_limit_mw, power_default_mw, power_mw (the draw),
 * temperature, utilization and mem_utilization (percent), pcie_gen,
 * pcie_gen_max, pcie_width, pcie_width_max, persistence, processes
 * (`unsupported` or `error`), process.
 *
 * Answers that change over time: `gpu.N.FIELD@MS = VALUE` (numeric fields
 * only, at most 64 such lines) makes the field read VALUE from MS
 * milliseconds after the first reading of a job's telemetry (the first
 * nvmlDeviceGetUtilizationRates call, which only the sampler makes), e.g.
 * the power cap holding the SM clock down 1.5 s into a job:
 *
 *   gpu.0.sm_clock@1500 = 1410
 *   gpu.0.throttle@1500 = 0x4
 *
 * Energy: energy_w, the power at which every GPU's total energy counter
 * (nvmlDeviceGetTotalEnergyConsumption) runs: it reads 1,000,000,000 mJ
 * when nvmlInit_v2 ran plus energy_w times the milliseconds since, from the
 * monotonic clock (400 W by default; `unsupported` for a GPU that keeps no
 * counter). It is not integrated over time: an `energy_w@MS` line would
 * rescale the whole count, so a scenario sets it once.
 *
 *   gpu.*.energy_w = 400
 *
 * Events: event_types (the mask nvmlDeviceGetSupportedEventTypes answers;
 * 0x1f by default, XID events included; 0x7 leaves them out), events_register
 * (`unsupported` or `error`: nvmlDeviceRegisterEvents fails for this GPU),
 * xid (an XID number, 0 for none) and xid_after_ms: an event set that holds
 * the GPU for XID events delivers that XID once, this long after the GPU was
 * registered in it.
 *
 *   gpu.2.xid = 79
 *   gpu.2.xid_after_ms = 200
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
typedef struct fake_gpu *nvmlDevice_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_UNKNOWN = 999,
};

/* Sentinels of a numeric field. */
#define UNSUPPORTED (-1LL)
#define FAILS (-2LL)

#define MAX_GPUS 16
#define MAX_PROCESSES 8

enum field {
    F_MEMORY_TOTAL_MIB, F_MEMORY_USED_MIB, F_MIG, F_ECC, F_ECC_VOLATILE, F_ECC_AGGREGATE,
    F_RETIRED_PENDING, F_REMAP_CORRECTED, F_REMAP_UNCORRECTED, F_REMAP_PENDING, F_REMAP_FAILED,
    F_THROTTLE, F_SM_CLOCK, F_SM_CLOCK_MAX, F_MEM_CLOCK, F_MEM_CLOCK_MAX, F_POWER_LIMIT_MW,
    F_POWER_DEFAULT_MW, F_TEMPERATURE, F_PCIE_GEN, F_PCIE_GEN_MAX, F_PCIE_WIDTH, F_PCIE_WIDTH_MAX,
    F_PERSISTENCE, F_PROCESSES, F_EVENT_TYPES, F_EVENTS_REGISTER, F_XID, F_XID_AFTER_MS, F_POWER_MW,
    F_UTILIZATION, F_MEM_UTILIZATION, F_ENERGY_W, F_ECC_CORRECTED, F_COUNT
};

static const char *const FIELD_NAMES[F_COUNT] = {
    "memory_total_mib", "memory_used_mib", "mig", "ecc", "ecc_volatile", "ecc_aggregate",
    "retired_pending", "remap_corrected", "remap_uncorrected", "remap_pending", "remap_failed",
    "throttle", "sm_clock", "sm_clock_max", "mem_clock", "mem_clock_max", "power_limit_mw",
    "power_default_mw", "temperature", "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max",
    "persistence", "processes", "event_types", "events_register", "xid", "xid_after_ms", "power_mw",
    "utilization", "mem_utilization", "energy_w", "ecc_corrected",
};

/* A healthy, idle H200. */
static const long long HEALTHY[F_COUNT] = {
    [F_MEMORY_TOTAL_MIB] = 143771, [F_MEMORY_USED_MIB] = 0, [F_MIG] = 0, [F_ECC] = 1,
    [F_ECC_VOLATILE] = 0, [F_ECC_AGGREGATE] = 0, [F_RETIRED_PENDING] = UNSUPPORTED,
    [F_REMAP_CORRECTED] = 0, [F_REMAP_UNCORRECTED] = 0, [F_REMAP_PENDING] = 0, [F_REMAP_FAILED] = 0,
    [F_THROTTLE] = 0x1, [F_SM_CLOCK] = 345, [F_SM_CLOCK_MAX] = 1980, [F_MEM_CLOCK] = 3201,
    [F_MEM_CLOCK_MAX] = 3201, [F_POWER_LIMIT_MW] = 700000, [F_POWER_DEFAULT_MW] = 700000,
    [F_TEMPERATURE] = 31, [F_PCIE_GEN] = 1, [F_PCIE_GEN_MAX] = 5, [F_PCIE_WIDTH] = 16,
    [F_PCIE_WIDTH_MAX] = 16, [F_PERSISTENCE] = 1, [F_PROCESSES] = 0,
    /* Single and double bit ECC, P-state, XID, clock. */
    [F_EVENT_TYPES] = 0x1f, [F_EVENTS_REGISTER] = 0, [F_XID] = 0, [F_XID_AFTER_MS] = 0,
    [F_POWER_MW] = 72000, [F_UTILIZATION] = 0, [F_MEM_UTILIZATION] = 0, [F_ENERGY_W] = 400,
    [F_ECC_CORRECTED] = 0,
};

struct fake_process {
    unsigned int pid;
    unsigned long long used_bytes;
};

struct fake_gpu {
    char name[96];
    char uuid[96];
    char serial[30];
    long long field[F_COUNT];
    struct fake_process processes[MAX_PROCESSES];
    unsigned int process_count;
};

static struct fake_gpu gpus[MAX_GPUS];

/* A field's answer from a time on: `gpu.N.FIELD@MS = VALUE`. */
#define MAX_CHANGES 64
static struct change {
    int gpu; /* -1: every GPU */
    enum field field;
    long long at_ms;
    long long value;
} changes[MAX_CHANGES];
static unsigned int change_count;
/* When the first telemetry reading was taken (0: not yet). */
static long long readings_since_ns;
/* When nvmlInit_v2 loaded the scenario: the energy counters' start. */
static long long loaded_ns;
/* What every energy counter reads at loaded_ns, mJ. */
#define ENERGY_AT_LOAD_MJ 1000000000LL
static long long now_ns(void);
static unsigned int gpu_count;
static char driver_version[80];
static int cuda_version;
static int initialized;

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    char *end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r')) *--end = '\0';
    return s;
}

static void copy(char *to, size_t size, const char *from) {
    snprintf(to, size, "%s", from);
}

/* Sets one GPU's field from the scenario's text; 0 when the key is unknown. */
static int set_field(struct fake_gpu *gpu, const char *key, const char *value) {
    if (strcmp(key, "name") == 0) { copy(gpu->name, sizeof gpu->name, value); return 1; }
    if (strcmp(key, "uuid") == 0) { copy(gpu->uuid, sizeof gpu->uuid, value); return 1; }
    if (strcmp(key, "serial") == 0) { copy(gpu->serial, sizeof gpu->serial, value); return 1; }
    if (strcmp(key, "process") == 0) {
        unsigned int pid;
        unsigned long long mib;
        if (sscanf(value, "%u:%llu", &pid, &mib) != 2 || gpu->process_count == MAX_PROCESSES) return 0;
        gpu->processes[gpu->process_count++] = (struct fake_process){pid, mib << 20};
        return 1;
    }
    for (int f = 0; f < F_COUNT; f++) {
        if (strcmp(key, FIELD_NAMES[f]) != 0) continue;
        if (strcmp(value, "unsupported") == 0) gpu->field[f] = UNSUPPORTED;
        else if (strcmp(value, "error") == 0) gpu->field[f] = FAILS;
        else gpu->field[f] = strtoll(value, NULL, 0);
        return 1;
    }
    return 0;
}

static void reset(void) {
    gpu_count = 1;
    change_count = 0;
    readings_since_ns = 0;
    copy(driver_version, sizeof driver_version, "550.54.15");
    cuda_version = 12040;
    for (unsigned int i = 0; i < MAX_GPUS; i++) {
        struct fake_gpu *gpu = &gpus[i];
        memset(gpu, 0, sizeof *gpu);
        copy(gpu->name, sizeof gpu->name, "NVIDIA H200");
        snprintf(gpu->uuid, sizeof gpu->uuid, "GPU-fa4e0000-0000-0000-0000-%012u", i);
        snprintf(gpu->serial, sizeof gpu->serial, "165092406%04u", i);
        memcpy(gpu->field, HEALTHY, sizeof HEALTHY);
    }
}

/* Reads the scenario; returns the NVML code nvmlInit_v2 answers. */
static nvmlReturn_t load(void) {
    reset();
    const char *path = getenv("FAKE_NVML_CONFIG");
    if (path == NULL) {
        fprintf(stderr, "fake nvml: set FAKE_NVML_CONFIG to a scenario file\n");
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    FILE *file = fopen(path, "r");
    if (file == NULL) {
        fprintf(stderr, "fake nvml: cannot open the scenario %s\n", path);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    nvmlReturn_t result = NVML_SUCCESS;
    char line[512];
    int number = 0;
    while (fgets(line, sizeof line, file) != NULL) {
        number++;
        char *hash = strchr(line, '#');
        if (hash != NULL) *hash = '\0';
        char *eq = strchr(line, '=');
        char *text = trim(line);
        if (*text == '\0') continue;
        if (eq == NULL) goto bad;
        *eq = '\0';
        char *key = trim(line), *value = trim(eq + 1);
        if (strcmp(key, "init") == 0) {
            if (strcmp(value, "driver_not_loaded") == 0) result = NVML_ERROR_DRIVER_NOT_LOADED;
            else if (strcmp(value, "no_permission") == 0) result = NVML_ERROR_NO_PERMISSION;
            else if (strcmp(value, "ok") != 0) goto bad;
        } else if (strcmp(key, "gpus") == 0) {
            gpu_count = (unsigned int)strtoul(value, NULL, 10);
            if (gpu_count > MAX_GPUS) goto bad;
        } else if (strcmp(key, "driver_version") == 0) {
            copy(driver_version, sizeof driver_version, value);
        } else if (strcmp(key, "cuda_version") == 0) {
            cuda_version = atoi(value);
        } else if (strncmp(key, "gpu.", 4) == 0 && strchr(key, '@') != NULL) {
            char *which = key + 4, *dot = strchr(which, '.'), *at = strchr(key, '@');
            if (dot == NULL || at < dot || change_count == MAX_CHANGES) goto bad;
            *dot = '\0';
            *at = '\0';
            int f = 0;
            while (f < F_COUNT && strcmp(dot + 1, FIELD_NAMES[f]) != 0) f++;
            if (f == F_COUNT) goto bad;
            changes[change_count++] = (struct change){strcmp(which, "*") == 0 ? -1 : atoi(which), (enum field)f,
                                                      strtoll(at + 1, NULL, 10), strtoll(value, NULL, 0)};
        } else if (strncmp(key, "gpu.", 4) == 0) {
            char *which = key + 4, *dot = strchr(which, '.');
            if (dot == NULL) goto bad;
            *dot = '\0';
            int ok = 1;
            for (unsigned int i = 0; i < MAX_GPUS; i++)
                if (strcmp(which, "*") == 0 || (unsigned int)atoi(which) == i)
                    ok &= set_field(&gpus[i], dot + 1, value);
            if (!ok) goto bad;
        } else {
            goto bad;
        }
        continue;
    bad:
        fprintf(stderr, "fake nvml: %s:%d: cannot read this line\n", path, number);
        result = NVML_ERROR_UNKNOWN;
        break;
    }
    fclose(file);
    return result;
}

/* The answer of a query of one numeric field: the value, or its error. */
static nvmlReturn_t field(nvmlDevice_t device, enum field f, long long *value) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    long long v = device->field[f];
    if (readings_since_ns != 0) {
        long long ms = (now_ns() - readings_since_ns) / 1000000LL, latest = -1;
        int index = (int)(device - gpus);
        for (unsigned int i = 0; i < change_count; i++) {
            const struct change *c = &changes[i];
            if (c->field == f && (c->gpu < 0 || c->gpu == index) && c->at_ms <= ms && c->at_ms >= latest) {
                v = c->value;
                latest = c->at_ms;
            }
        }
    }
    if (v == UNSUPPORTED) return NVML_ERROR_NOT_SUPPORTED;
    if (v == FAILS) return NVML_ERROR_UNKNOWN;
    *value = v;
    return NVML_SUCCESS;
}

#define UINT_FIELD(f, out)                              \
    do {                                                \
        long long v_;                                   \
        nvmlReturn_t r_ = field(device, (f), &v_);      \
        if (r_ != NVML_SUCCESS) return r_;              \
        *(out) = (unsigned int)v_;                      \
    } while (0)

static nvmlReturn_t string(const char *value, char *out, unsigned int length) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    copy(out, length, value);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------ system --- */

nvmlReturn_t nvmlInit_v2(void) {
    nvmlReturn_t r = load();
    initialized = r == NVML_SUCCESS;
    loaded_ns = now_ns();
    return r;
}

nvmlReturn_t nvmlShutdown(void) {
    initialized = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    return string(driver_version, version, length);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *version = cuda_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *count = gpu_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (index >= gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (uuid == NULL || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < gpu_count; i++) {
        if (strcmp(gpus[i].uuid, uuid) == 0) {
            *device = &gpus[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* ---------------------------------------------------------- identity --- */

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    return string(device->name, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    return string(device->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    return string(device->serial, serial, length);
}

/* ------------------------------------------------------------ memory --- */

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    long long total, used;
    nvmlReturn_t r = field(device, F_MEMORY_TOTAL_MIB, &total);
    if (r == NVML_SUCCESS) r = field(device, F_MEMORY_USED_MIB, &used);
    if (r != NVML_SUCCESS) return r;
    /* NVML_STRUCT_VERSION(Memory, 2), as nvml-wrapper sets it. */
    if (memory->version != (unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24))) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = (unsigned long long)total << 20;
    memory->used = (unsigned long long)used << 20;
    memory->reserved = 0;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

/* --------------------------------------------------- modes and errors --- */

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    UINT_FIELD(F_MIG, current);
    *pending = *current;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, int *current, int *pending) {
    UINT_FIELD(F_ECC, (unsigned int *)current);
    *pending = *current;
    return NVML_SUCCESS;
}

/* errorType 0 = corrected, 1 = uncorrected; counterType 0 = volatile, 1 = aggregate. */
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int error_type, int counter_type,
                                         unsigned long long *count) {
    long long v;
    int f = error_type == 0 ? F_ECC_CORRECTED : counter_type == 0 ? F_ECC_VOLATILE : F_ECC_AGGREGATE;
    nvmlReturn_t r = field(device, f, &v);
    if (r == NVML_SUCCESS) *count = (unsigned long long)v;
    return r;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, int *pending) {
    UINT_FIELD(F_RETIRED_PENDING, (unsigned int *)pending);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrected, unsigned int *uncorrected,
                                       unsigned int *pending, unsigned int *failed) {
    UINT_FIELD(F_REMAP_CORRECTED, corrected);
    UINT_FIELD(F_REMAP_UNCORRECTED, uncorrected);
    UINT_FIELD(F_REMAP_PENDING, pending);
    UINT_FIELD(F_REMAP_FAILED, failed);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, int *mode) {
    UINT_FIELD(F_PERSISTENCE, (unsigned int *)mode);
    return NVML_SUCCESS;
}

/* ------------------------------------------------ clocks, power, heat --- */

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
    long long v;
    nvmlReturn_t r = field(device, F_THROTTLE, &v);
    if (r == NVML_SUCCESS) *reasons = (unsigned long long)v;
    return r;
}

/* clockType 1 = SM, 2 = memory. */
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *mhz) {
    if (type != 1 && type != 2) return NVML_ERROR_NOT_SUPPORTED;
    UINT_FIELD(type == 1 ? F_SM_CLOCK : F_MEM_CLOCK, mhz);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned int *mhz) {
    if (type != 1 && type != 2) return NVML_ERROR_NOT_SUPPORTED;
    UINT_FIELD(type == 1 ? F_SM_CLOCK_MAX : F_MEM_CLOCK_MAX, mhz);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *milliwatts) {
    UINT_FIELD(F_POWER_MW, milliwatts);
    return NVML_SUCCESS;
}

/* Millijoules: the counter at load plus energy_w (W = mJ per ms) times the
 * milliseconds since, to the nanosecond. */
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy) {
    long long watts;
    nvmlReturn_t r = field(device, F_ENERGY_W, &watts);
    if (r != NVML_SUCCESS) return r;
    if (energy == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *energy = (unsigned long long)(ENERGY_AT_LOAD_MJ + watts * (now_ns() - loaded_ns) / 1000000LL);
    return NVML_SUCCESS;
}

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

/* The sampler's own call: the first one starts the scenario's clock of changes. */
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    if (initialized && readings_since_ns == 0) readings_since_ns = now_ns();
    UINT_FIELD(F_UTILIZATION, &utilization->gpu);
    UINT_FIELD(F_MEM_UTILIZATION, &utilization->memory);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *milliwatts) {
    UINT_FIELD(F_POWER_LIMIT_MW, milliwatts);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int *milliwatts) {
    UINT_FIELD(F_POWER_DEFAULT_MW, milliwatts);
    return NVML_SUCCESS;
}

/* sensorType 0 = the GPU die. */
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *celsius) {
    if (sensor != 0) return NVML_ERROR_NOT_SUPPORTED;
    UINT_FIELD(F_TEMPERATURE, celsius);
    return NVML_SUCCESS;
}

/* -------------------------------------------------------------- PCIe --- */

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *generation) {
    UINT_FIELD(F_PCIE_GEN, generation);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *generation) {
    UINT_FIELD(F_PCIE_GEN_MAX, generation);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *width) {
    UINT_FIELD(F_PCIE_WIDTH, width);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *width) {
    UINT_FIELD(F_PCIE_WIDTH_MAX, width);
    return NVML_SUCCESS;
}

/* --------------------------------------------------------- processes --- */

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

/* NVML's two-call protocol: a short buffer gets INSUFFICIENT_SIZE and the
 * count; a large enough one gets the processes. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    long long mode;
    nvmlReturn_t r = field(device, F_PROCESSES, &mode);
    if (r != NVML_SUCCESS) return r;
    if (*count < device->process_count) {
        *count = device->process_count;
        return device->process_count == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < device->process_count; i++)
        infos[i] = (nvmlProcessInfo_t){device->processes[i].pid, device->processes[i].used_bytes, 0xFFFFFFFFu,
                                       0xFFFFFFFFu};
    *count = device->process_count;
    return NVML_SUCCESS;
}

/* Compute GPUs in a data centre run no graphics contexts. */
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                      nvmlProcessInfo_t *infos) {
    (void)infos;
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int)(device - gpus);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------ events --- */

#define EVENT_XID_CRITICAL 0x8ULL

/* A set holds each registered GPU once, with its scenario XID's due time. */
struct fake_event_set {
    struct {
        nvmlDevice_t device;
        unsigned long long types;
        long long xid_due_ns;
        int xid_delivered;
    } entries[MAX_GPUS];
    unsigned int count;
};
typedef struct fake_event_set *nvmlEventSet_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Sleeps until the monotonic clock reads `deadline`, through interruptions. */
static void sleep_until(long long deadline) {
    long long left;
    while ((left = deadline - now_ns()) > 0) {
        struct timespec t = {(time_t)(left / 1000000000LL), (long)(left % 1000000000LL)};
        if (nanosleep(&t, NULL) != 0 && errno != EINTR) return;
    }
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof **set);
    return *set == NULL ? NVML_ERROR_UNKNOWN : NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    free(set);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    long long v;
    nvmlReturn_t r = field(device, F_EVENT_TYPES, &v);
    if (r == NVML_SUCCESS) *types = (unsigned long long)v;
    return r;
}

/* Like NVML, asking for an event type the GPU does not support fails. */
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
    long long supported, fails;
    nvmlReturn_t r = field(device, F_EVENT_TYPES, &supported);
    if (r == NVML_SUCCESS) r = field(device, F_EVENTS_REGISTER, &fails);
    if (r != NVML_SUCCESS) return r;
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~(unsigned long long)supported) return NVML_ERROR_NOT_SUPPORTED;
    unsigned int i = 0;
    while (i < set->count && set->entries[i].device != device) i++;
    if (i == set->count) {
        set->count++;
        set->entries[i].device = device;
        set->entries[i].types = 0;
        set->entries[i].xid_delivered = 0;
        set->entries[i].xid_due_ns = now_ns() + device->field[F_XID_AFTER_MS] * 1000000LL;
    }
    set->entries[i].types |= types;
    return NVML_SUCCESS;
}

/* Delivers the earliest XID that is due; sleeps for it when it falls due
 * within the timeout, else for the whole timeout, and then times out. */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (set == NULL || data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    long long deadline = now_ns() + (long long)timeout_ms * 1000000LL;
    for (;;) {
        int next = -1;
        for (unsigned int i = 0; i < set->count; i++) {
            if (set->entries[i].xid_delivered || !(set->entries[i].types & EVENT_XID_CRITICAL)) continue;
            if (set->entries[i].device->field[F_XID] <= 0) continue;
            if (next < 0 || set->entries[i].xid_due_ns < set->entries[next].xid_due_ns) next = (int)i;
        }
        long long now = now_ns();
        if (next >= 0 && set->entries[next].xid_due_ns <= now) {
            set->entries[next].xid_delivered = 1;
            nvmlDevice_t device = set->entries[next].device;
            *data = (nvmlEventData_t){device, EVENT_XID_CRITICAL, (unsigned long long)device->field[F_XID],
                                      0xFFFFFFFFu, 0xFFFFFFFFu};
            return NVML_SUCCESS;
        }
        if (now >= deadline) return NVML_ERROR_TIMEOUT;
        sleep_until(next >= 0 && set->entries[next].xid_due_ns < deadline ? set->entries[next].xid_due_ns : deadline);
    }
}
