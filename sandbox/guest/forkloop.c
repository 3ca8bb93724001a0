/*
 * The zygote's fork loop in C: receive a fork request, fork, answer, and again, without
 * returning to Python in the zygote between forks.
 *
 * Why C: after each fork every page of the zygote is shared copy-on-write with the new child,
 * so every page the zygote writes before its next fork is copied. Python writes wherever it
 * looks (reference counts of every object it touches, its frames, its allocator, the fork hooks
 * of `os.register_at_fork`), and the Python loop of `zygote.py` wrote about 108 pages per fork;
 * this loop writes 3 or 4 (its stack and the request below). Measured by `bench.forkserver`: the
 * zygote's CPU per sandbox 0.50 -> 0.25 ms, the machine's per execution about 0.2 ms less (the
 * child now copies the pages both of them write, which the zygote used to copy first). No
 * library forks from a Python process without running Python between forks; that is the only
 * thing this file does. After editing it, install the package again (`scripts/setup.sh` does
 * when this file changes) and bump PTC_FORK_LOOP_ABI with any change to the call or the struct.
 *
 * A plain C library, not a Python extension: it uses no Python API, so one build serves every
 * interpreter a zygote runs (a runtime's own Python included). `_forkloop.py` loads it through
 * ctypes (PyDLL: the GIL stays held, as `os.fork` holds it) and passes the three fork hooks of
 * the running interpreter: PyOS_BeforeFork once when the loop starts, PyOS_AfterFork_Parent once
 * when it returns, PyOS_AfterFork_Child in each child. The zygote has one thread, and nothing
 * runs in it while it is in here, so one critical section around many forks is what one around
 * each fork would be (the import lock and logging's lock stay held; each child re-initialises
 * them, as after any fork).
 *
 * It takes only a well-formed request: ``fork DIGITS pidfd|reaper`` with exactly four
 * descriptors, at most 18 digits. Anything else (``retire``, a malformed request, a truncated
 * message or descriptor list) is handed back to Python untouched, which answers it as the
 * Python loop always has. The fork is the Python loop's: clone3 into a new pid namespace with
 * CLONE_CHILD_SETTID at the address `_confine.CloneIntoPidNamespace` proved, when allowed and
 * the request asks for a pidfd; else fork(2).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

/* Bumped with any change to the call or the struct below; `_forkloop.py` checks it. */
#define PTC_FORK_LOOP_ABI 1

#define MAX_FDS 8            /* as many as the Python loop accepts before it refuses */
#define REQUEST_FDS 4        /* channel, stdout, stderr, exit status */
#define MAX_MESSAGE 4096     /* zygote.MAX_CONTROL_BYTES */
#define MAX_DIGITS 18        /* fits int64 */

enum outcome {
    PTC_CHILD = 0,       /* in a new child: the request's fields below */
    PTC_EOF = 1,         /* the host closed the socket */
    PTC_MESSAGE = 2,     /* a message this loop does not take: message and fds below */
    PTC_FORK_FAILED = 3, /* error holds errno; fds below still open, tmp_bytes, reaper set */
};

struct clone_args_v0 {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
};

struct ptc_fork_request {
    int32_t outcome;     /* enum outcome, or -errno of the control socket */
    int32_t error;
    int32_t fd_count;
    int32_t fds[MAX_FDS];
    int64_t tmp_bytes;
    int32_t reaper;
    int32_t direct;      /* born pid 1 of its own pid namespace (clone3) */
    int32_t length;      /* bytes of message */
    uint8_t message[MAX_MESSAGE];
};

typedef void (*fork_hook)(void);

int ptc_fork_loop_abi(void) { return PTC_FORK_LOOP_ABI; }

static int receive(int control, struct ptc_fork_request *out, int *flags)
{
    union {
        char buffer[CMSG_SPACE(MAX_FDS * sizeof(int))];
        struct cmsghdr align;
    } ancillary;
    struct iovec iov = { out->message, sizeof(out->message) };
    struct msghdr msg;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ancillary.buffer;
    msg.msg_controllen = sizeof(ancillary.buffer);
    ssize_t received = recvmsg(control, &msg, 0);
    if (received < 0)
        return -errno;
    out->fd_count = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count && out->fd_count < MAX_FDS; i++)
            memcpy(&out->fds[out->fd_count++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
    }
    out->length = (int32_t)received;
    *flags = msg.msg_flags;
    return 0;
}

/* ``fork DIGITS pidfd|reaper``: 1 and the fields set, or 0. */
static int parse(struct ptc_fork_request *out, int flags)
{
    const uint8_t *p = out->message, *end = out->message + out->length;
    if (out->fd_count != REQUEST_FDS || (flags & (MSG_TRUNC | MSG_CTRUNC)))
        return 0;
    if (end - p < 5 || memcmp(p, "fork ", 5) != 0)
        return 0;
    p += 5;
    int64_t tmp_bytes = 0;
    int digits = 0;
    while (p < end && *p >= '0' && *p <= '9') {
        if (++digits > MAX_DIGITS)
            return 0;
        tmp_bytes = tmp_bytes * 10 + (*p++ - '0');
    }
    if (digits == 0 || p == end || *p++ != ' ')
        return 0;
    if (end - p == 5 && memcmp(p, "pidfd", 5) == 0)
        out->reaper = 0;
    else if (end - p == 6 && memcmp(p, "reaper", 6) == 0)
        out->reaper = 1;
    else
        return 0;
    out->tmp_bytes = tmp_bytes;
    return 1;
}

static long fork_one(int direct, uint64_t clone_flags, uint64_t tid_address)
{
    if (!direct)
        return fork();
    struct clone_args_v0 args;
    memset(&args, 0, sizeof(args));
    args.flags = clone_flags;
    args.child_tid = tid_address;
    args.exit_signal = SIGCHLD;
    return syscall(SYS_clone3, &args, sizeof(args));
}

/*
 * Serves fork requests on ``control`` until one it does not take. Returns out->outcome: in a
 * child PTC_CHILD (after after_child); in the zygote PTC_EOF, PTC_MESSAGE, PTC_FORK_FAILED or
 * -errno of recvmsg/send (-EINTR: a signal arrived, for Python to handle before it calls again).
 */
int ptc_fork_loop(int control, uint64_t clone_flags, uint64_t tid_address, int clone_allowed,
                  fork_hook before, fork_hook after_parent, fork_hook after_child,
                  struct ptc_fork_request *out)
{
    before();
    for (;;) {
        int flags = 0;
        int status = receive(control, out, &flags);
        if (status < 0) {
            out->outcome = status;
            break;
        }
        if (out->length == 0) {
            for (int i = 0; i < out->fd_count; i++)
                close(out->fds[i]);
            out->fd_count = 0;
            out->outcome = PTC_EOF;
            break;
        }
        if (!parse(out, flags)) {
            out->outcome = PTC_MESSAGE;
            break;
        }
        out->direct = clone_allowed && !out->reaper;
        long pid = fork_one(out->direct, clone_flags, tid_address);
        if (pid == 0) {
            after_child();
            out->outcome = PTC_CHILD;
            return PTC_CHILD;
        }
        if (pid < 0) {
            out->error = errno;
            out->outcome = PTC_FORK_FAILED;
            break;
        }
        for (int i = 0; i < REQUEST_FDS; i++)
            close(out->fds[i]);
        /* 1: the pid is the sandbox's pid 1 (0: its first child's, which reports pid 1). */
        char reply[48];
        int length = snprintf(reply, sizeof(reply), "forked %ld %d", pid, out->direct);
        if (send(control, reply, (size_t)length, 0) < 0) {
            out->outcome = -errno;
            break;
        }
    }
    after_parent();
    return out->outcome;
}
