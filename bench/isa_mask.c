/* Make this process (and what it starts) see an AVX2 + FMA CPU without AVX-512, VNNI or AMX.
 *
 * Loaded with LD_PRELOAD by bench/isa_mask.py. Kernel libraries (onnxruntime's MLAS, OpenBLAS,
 * oneDNN under torch, numpy's dispatch) pick their kernels from the CPUID instruction; the
 * runtime and the bench read /proc/cpuinfo. Both are answered here:
 *
 * - CPUID: arch_prctl(ARCH_SET_CPUID, 0) turns on CPUID faulting for this thread (inherited by
 *   every thread and fork after it; execve resets it, and LD_PRELOAD in the environment sets it
 *   again). Each CPUID then raises SIGSEGV; the handler runs the real instruction with faulting
 *   briefly off, clears the AVX-512, VNNI (all forms), AMX, AVX10, AVX-IFMA and BF16 bits, and
 *   steps over the instruction. The process's own SIGSEGV handlers (Python's faulthandler,
 *   pytest) are kept aside by interposing sigaction/signal and get every other SIGSEGV.
 * - /proc/cpuinfo: open/openat/fopen (and their 64-bit and fortified forms) of that path
 *   return a copy with those flags removed from every `flags` line and " [isa mask: avx2]"
 *   added to every `model name`, so every table the bench writes names the mask.
 *
 * The instructions themselves still execute; what changes is the kernels chosen. glibc picks
 * its own string functions before this library loads; bench/isa_mask.py sets GLIBC_TUNABLES
 * for those. Needs a CPU and kernel with CPUID faulting (`cpuid_fault` in /proc/cpuinfo);
 * without it the constructor exits the process with status 3 and a message. Not covered: a
 * thread that blocks SIGSEGV dies at its first CPUID (the kernel cannot deliver the fault).
 */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define BIT(n) (1u << (n))

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
static sigaction_fn real_sigaction_fn;
static struct sigaction app_action; /* the process's own SIGSEGV disposition (SIG_DFL first) */
static int installed;               /* our handler is in place: sigaction calls are kept aside */

static int real_sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    if (!real_sigaction_fn) real_sigaction_fn = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    return real_sigaction_fn(sig, act, old);
}

/* CPUID.(EAX=7,ECX=0): AVX-512 F/DQ/IFMA/PF/ER/CD/BW/VL in EBX; VBMI, VBMI2, VNNI, BITALG,
 * VPOPCNTDQ in ECX; 4VNNIW, 4FMAPS, VP2INTERSECT, AMX-BF16, AVX512-FP16, AMX-TILE, AMX-INT8 in
 * EDX. CPUID.(EAX=7,ECX=1): AVX-VNNI and AVX512-BF16 in EAX. */
static const unsigned leaf7_ebx = BIT(16) | BIT(17) | BIT(21) | BIT(26) | BIT(27) | BIT(28) |
                                  BIT(30) | BIT(31);
static const unsigned leaf7_ecx = BIT(1) | BIT(6) | BIT(11) | BIT(12) | BIT(14);
static const unsigned leaf7_edx = BIT(2) | BIT(3) | BIT(8) | BIT(22) | BIT(23) | BIT(24) |
                                  BIT(25);
static const unsigned leaf7_1_eax = BIT(4) | BIT(5) | BIT(21) | BIT(23);
/* CPUID.(EAX=7,ECX=1).EDX: AVX-VNNI-INT8, AVX-NE-CONVERT, AMX-COMPLEX, AVX-VNNI-INT16, AVX10. */
static const unsigned leaf7_1_edx = BIT(4) | BIT(5) | BIT(8) | BIT(10) | BIT(19);

/* Hand a SIGSEGV that is not ours to the process's own handler, or let it kill the process. */
static void forward(int sig, siginfo_t *info, void *context) {
    struct sigaction app = app_action;
    if (app.sa_handler == SIG_IGN || app.sa_handler == SIG_DFL) {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        installed = 0;
        real_sigaction(sig, &dfl, NULL);
        /* A fault re-executes its instruction on return and dies there; a signal sent by
         * kill/raise is raised again, now with the default action. */
        if (info->si_code <= 0) raise(sig);
        return;
    }
    if (app.sa_flags & SA_SIGINFO) {
        app.sa_sigaction(sig, info, context);
    } else {
        app.sa_handler(sig);
    }
}

static void set_faulting(int on) { syscall(SYS_arch_prctl, ARCH_SET_CPUID, on ? 0 : 1); }

static void on_sigsegv(int sig, siginfo_t *info, void *context) {
    ucontext_t *uc = context;
    greg_t *regs = uc->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)regs[REG_RIP];
    /* CPUID faulting raises #GP, which the kernel reports as SI_KERNEL; anything else is a
     * real crash: restore the default action and let the instruction fault again. */
    if (info->si_code != SI_KERNEL || ip[0] != 0x0f || ip[1] != 0xa2) {
        forward(sig, info, context);
        return;
    }
    unsigned leaf = (unsigned)regs[REG_RAX], sub = (unsigned)regs[REG_RCX];
    unsigned a, b, c, d;
    set_faulting(0);
    __cpuid_count(leaf, sub, a, b, c, d);
    set_faulting(1);
    if (leaf == 7 && sub == 0) {
        b &= ~leaf7_ebx;
        c &= ~leaf7_ecx;
        d &= ~leaf7_edx;
    } else if (leaf == 7 && sub == 1) {
        a &= ~leaf7_1_eax;
        d &= ~leaf7_1_edx;
    } else if (leaf == 0x24) {
        a = b = c = d = 0; /* AVX10's own leaf, meaningless without its bit */
    }
    regs[REG_RAX] = a;
    regs[REG_RBX] = b;
    regs[REG_RCX] = c;
    regs[REG_RDX] = d;
    regs[REG_RIP] += 2;
}

static int hidden_flag(const char *word, size_t len) {
    static const char *prefixes[] = {"avx512", "avx_vnni", "amx_", NULL};
    for (const char **p = prefixes; *p; p++) {
        size_t n = strlen(*p);
        if (len >= n && strncmp(word, *p, n) == 0) return 1;
    }
    return 0;
}

static char *masked_cpuinfo = NULL;
static size_t masked_len = 0;

/* The real /proc/cpuinfo, read with raw syscalls (our own open is interposed). */
static char *read_real_cpuinfo(size_t *len) {
    int fd = (int)syscall(SYS_openat, AT_FDCWD, "/proc/cpuinfo", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        if (n == cap) {
            char *bigger = realloc(buf, cap *= 2);
            if (!bigger) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
        }
        ssize_t got = syscall(SYS_read, fd, buf + n, cap - n);
        if (got <= 0) break;
        n += (size_t)got;
    }
    syscall(SYS_close, fd);
    if (!buf) return NULL;
    *len = n;
    return buf;
}

static void build_masked_cpuinfo(void) {
    size_t len;
    char *real = read_real_cpuinfo(&len);
    if (!real) return;
    static const char tag[] = " [isa mask: avx2]";
    size_t names = 0;
    for (const char *q = real; q + 10 <= real + len; q++)
        if ((q == real || q[-1] == '\n') && strncmp(q, "model name", 10) == 0) names++;
    char *out = malloc(len + names * sizeof tag + 1), *o = out;
    if (!out) {
        free(real);
        return;
    }
    const char *line = real, *end = real + len;
    while (line < end) {
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        const char *stop = nl ? nl : end;
        size_t line_len = (size_t)(stop - line);
        if (line_len >= 5 && strncmp(line, "flags", 5) == 0) {
            const char *colon = memchr(line, ':', line_len);
            const char *w = colon ? colon + 1 : stop;
            memcpy(o, line, (size_t)(w - line));
            o += w - line;
            while (w < stop) {
                while (w < stop && *w == ' ') w++;
                const char *we = w;
                while (we < stop && *we != ' ') we++;
                if (we > w && !hidden_flag(w, (size_t)(we - w))) {
                    *o++ = ' ';
                    memcpy(o, w, (size_t)(we - w));
                    o += we - w;
                }
                w = we;
            }
        } else {
            memcpy(o, line, line_len);
            o += line_len;
            if (line_len >= 10 && strncmp(line, "model name", 10) == 0) {
                memcpy(o, tag, sizeof tag - 1);
                o += sizeof tag - 1;
            }
        }
        if (nl) *o++ = '\n';
        line = nl ? nl + 1 : end;
    }
    free(real);
    masked_cpuinfo = out;
    masked_len = (size_t)(o - out);
}

static int is_cpuinfo(const char *path) {
    return path && (strcmp(path, "/proc/cpuinfo") == 0);
}

static int masked_fd(void) {
    int fd = memfd_create("cpuinfo", MFD_CLOEXEC);
    if (fd < 0) return -1;
    size_t done = 0;
    while (done < masked_len) {
        ssize_t n = write(fd, masked_cpuinfo + done, masked_len - done);
        if (n <= 0) break;
        done += (size_t)n;
    }
    lseek(fd, 0, SEEK_SET);
    return fd;
}

typedef int (*openat_fn)(int, const char *, int, ...);

/* Every open below: the masked copy for /proc/cpuinfo, else the real file (a raw syscall, as
 * this library replaces libc's open). */
static int open_at(int dirfd, const char *path, int flags, mode_t mode) {
    if (masked_cpuinfo && is_cpuinfo(path)) return masked_fd();
    return (int)syscall(SYS_openat, dirfd, path, flags, mode);
}

static mode_t mode_arg(int flags, va_list ap) {
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

int openat(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return open_at(dirfd, path, flags, mode);
}

int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return open_at(AT_FDCWD, path, flags, mode);
}

/* glibc's fortified forms (no mode: they refuse O_CREAT without one). */
int __open_2(const char *path, int flags) { return open_at(AT_FDCWD, path, flags, 0); }
int __openat_2(int dirfd, const char *path, int flags) { return open_at(dirfd, path, flags, 0); }

/* On x86-64 the 64-bit names are the same calls. */
int openat64(int dirfd, const char *path, int flags, ...) __attribute__((alias("openat")));
int open64(const char *path, int flags, ...) __attribute__((alias("open")));
int __open64_2(const char *path, int flags) __attribute__((alias("__open_2")));
int __openat64_2(int dirfd, const char *path, int flags) __attribute__((alias("__openat_2")));

/* SIGSEGV stays ours: the process's own disposition is kept aside and called by forward(). */
int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    if (sig != SIGSEGV || !installed) return real_sigaction(sig, act, old);
    if (old) *old = app_action;
    if (act) app_action = *act;
    return 0;
}

sighandler_t signal(int sig, sighandler_t handler) {
    if (sig != SIGSEGV || !installed) {
        static sighandler_t (*real_signal)(int, sighandler_t);
        if (!real_signal) real_signal = (sighandler_t(*)(int, sighandler_t))dlsym(RTLD_NEXT, "signal");
        return real_signal(sig, handler);
    }
    sighandler_t previous = app_action.sa_handler;
    memset(&app_action, 0, sizeof app_action);
    app_action.sa_handler = handler;
    return previous;
}

FILE *fopen(const char *path, const char *how) {
    static FILE *(*real_fopen)(const char *, const char *) = NULL;
    if (masked_cpuinfo && is_cpuinfo(path)) {
        int fd = masked_fd();
        return fd < 0 ? NULL : fdopen(fd, "r");
    }
    if (!real_fopen) real_fopen = (FILE * (*)(const char *, const char *)) dlsym(RTLD_NEXT, "fopen");
    return real_fopen(path, how);
}

FILE *fopen64(const char *path, const char *how) { return fopen(path, how); }

__attribute__((constructor)) static void isa_mask_init(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigsegv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    app_action.sa_handler = SIG_DFL;
    real_sigaction(SIGSEGV, &sa, NULL);
    installed = 1;
    if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) {
        static const char msg[] =
            "isa mask: this CPU or kernel has no CPUID faulting (arch_prctl ARCH_SET_CPUID "
            "failed); cannot hide AVX-512 from this process\n";
        syscall(SYS_write, 2, msg, sizeof msg - 1);
        _exit(3);
    }
    build_masked_cpuinfo();
}
