// PowerLossVFS: a test VFS over SQLite's default one that simulates a power cut the way
// SQLite's own crash tests do: every write not yet made durable by an xSync of its file is,
// at the cut, kept, dropped or torn sector by sector (512 bytes), at random from a seed.
//
// Only files under the armed directory are watched; every other file passes straight through,
// so the VFS can be the process's default while unrelated tests run beside it.

#ifndef POWER_LOSS_VFS_H
#define POWER_LOSS_VFS_H

#include <stdint.h>

/// Registers the VFS as "powerloss" and makes it SQLite's default, once per process (later
/// calls do nothing). Connections opened before keep the VFS they had. Returns an SQLite code.
int powerloss_install(void);

/// Watches the files under `directory` (a path prefix ending in '/'), forgetting any earlier
/// state. The cut comes at the `cutAt`-th watched write, truncate or sync (counted from 1);
/// `cutAt` <= 0 never cuts. `seed` drives every keep/drop/tear choice at the cut.
void powerloss_arm(const char *directory, uint64_t seed, int64_t cutAt);

/// Stops watching and lets I/O through again: the "power is back" step, once every connection
/// to the watched files is closed.
void powerloss_disarm(void);

/// 1 once the cut has happened (every watched I/O then fails with SQLITE_IOERR).
int powerloss_has_cut(void);

/// Watched writes, truncates and syncs so far (the cut's operation included).
int64_t powerloss_operations(void);

/// Writes the cut found unsynced, and how many of them it kept whole, dropped or tore.
typedef struct {
    int64_t unsynced;
    int64_t kept;
    int64_t dropped;
    int64_t torn;
} powerloss_outcome;

/// What the cut did to the unsynced writes (zeros before a cut).
powerloss_outcome powerloss_last_outcome(void);

/// Test mutation: when 1, xSync reports success without making anything durable (a disk that
/// ignores flushes). Default 0. Reset by powerloss_arm.
void powerloss_set_ignore_syncs(int ignore);

#endif
