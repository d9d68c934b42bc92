// PowerLossVFS: see include/PowerLossVFS.h. The idea is SQLite's crash simulation (test6.c,
// "crash tests"): remember what a file was asked to write since its last sync and decide,
// at the cut, what of it reached the platter. Written for this project, not copied.
//
// Model: a watched write goes straight to the real file (so reads see it), after the bytes it
// overwrites and the file's size are saved. A successful xSync of a file forgets its saved
// writes: they are durable. At the cut, each file's unsynced writes are undone newest first,
// and each is kept, dropped or torn; a torn write is decided per 512-byte sector (kept, old
// bytes back, or random bytes), as a disk that loses power mid-write leaves it. A sector kept
// (or scrambled) by a newer write settles it: an older write to it cannot come back over it.

#include "PowerLossVFS.h"

#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SECTOR 512

typedef struct {
    sqlite3_int64 offset;
    sqlite3_int64 length;      // bytes written, or bytes cut off by a truncate
    sqlite3_int64 oldSize;     // the file's size before the operation
    unsigned char *old;        // the bytes the operation replaced (zeros past the old end)
    int isTruncate;
} SavedWrite;

typedef struct WatchedFile {
    char *path;
    SavedWrite *writes;
    int count, capacity;
    struct WatchedFile *next;
} WatchedFile;

typedef struct {
    sqlite3_file base;
    sqlite3_file *real;        // the default VFS's file, allocated right after this struct
    WatchedFile *watched;      // NULL: passed straight through
} PLFile;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static sqlite3_vfs *realVFS;
static char *armedDirectory;
static uint64_t rngState;
static int64_t cutAt, operations;
static int hasCut, ignoreSyncs;
static WatchedFile *files;
static powerloss_outcome outcome;

static uint64_t next_random(void) {
    // splitmix64: small, seedable, good enough to spread choices.
    uint64_t z = (rngState += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void forget_writes(WatchedFile *file) {
    for (int i = 0; i < file->count; i++) free(file->writes[i].old);
    file->count = 0;
}

// Nodes are never freed: an open file keeps pointing at its node, and a test makes a handful.
static void forget_all(void) {
    for (WatchedFile *f = files; f; f = f->next) forget_writes(f);
}

static WatchedFile *watched_file(const char *path) {
    if (!armedDirectory || !path || strncmp(path, armedDirectory, strlen(armedDirectory)) != 0) return NULL;
    for (WatchedFile *f = files; f; f = f->next) if (strcmp(f->path, path) == 0) return f;
    WatchedFile *f = calloc(1, sizeof *f);
    f->path = strdup(path);
    f->next = files;
    files = f;
    return f;
}

static void save(WatchedFile *file, SavedWrite write) {
    if (file->count == file->capacity) {
        file->capacity = file->capacity ? file->capacity * 2 : 64;
        file->writes = realloc(file->writes, sizeof(SavedWrite) * (size_t)file->capacity);
    }
    file->writes[file->count++] = write;
}

static int settled(const int64_t *sectors, int count, int64_t sector) {
    for (int i = 0; i < count; i++) if (sectors[i] == sector) return 1;
    return 0;
}

// The power cut: decide the fate of every unsynced write, newest first, on the real files.
static void cut_power(void) {
    hasCut = 1;
    for (WatchedFile *file = files; file; file = file->next) {
        if (file->count == 0) continue;
        int fd = open(file->path, O_RDWR);
        if (fd < 0) { forget_writes(file); continue; }
        int64_t *kept = NULL;
        int keptCount = 0, keptCapacity = 0;
        sqlite3_int64 keptEnd = 0;
        for (int i = file->count - 1; i >= 0; i--) {
            SavedWrite *w = &file->writes[i];
            outcome.unsynced++;
            int choice = (int)(next_random() % 3); // 0 keep, 1 drop, 2 tear
            if (w->isTruncate) {
                // A truncate is kept or undone whole. Kept, it settles what it cut off (older
                // writes there are gone with it); undone, its cut-off bytes come back except in
                // sectors a newer kept write settled.
                if (choice == 0) outcome.kept++; else outcome.dropped++;
                for (sqlite3_int64 s = w->offset / SECTOR; s * SECTOR < w->offset + w->length; s++) {
                    if (settled(kept, keptCount, s)) continue;
                    if (choice != 0) {
                        sqlite3_int64 lo = s * SECTOR > w->offset ? s * SECTOR : w->offset;
                        sqlite3_int64 hi = (s + 1) * SECTOR < w->offset + w->length ? (s + 1) * SECTOR : w->offset + w->length;
                        if (pwrite(fd, w->old + (lo - w->offset), (size_t)(hi - lo), lo) != hi - lo) { /* best effort */ }
                        continue;
                    }
                    if (keptCount == keptCapacity) {
                        keptCapacity = keptCapacity ? keptCapacity * 2 : 256;
                        kept = realloc(kept, sizeof(int64_t) * (size_t)keptCapacity);
                    }
                    kept[keptCount++] = s;
                }
                continue;
            }
            if (choice == 0) outcome.kept++; else if (choice == 1) outcome.dropped++; else outcome.torn++;
            sqlite3_int64 end = w->offset + w->length;
            for (sqlite3_int64 s = w->offset / SECTOR; s * SECTOR < end; s++) {
                if (settled(kept, keptCount, s)) continue;
                sqlite3_int64 lo = s * SECTOR > w->offset ? s * SECTOR : w->offset;
                sqlite3_int64 hi = (s + 1) * SECTOR < end ? (s + 1) * SECTOR : end;
                int fate = choice == 2 ? (int)(next_random() % 3) : choice;
                if (fate == 1) {
                    if (pwrite(fd, w->old + (lo - w->offset), (size_t)(hi - lo), lo) != hi - lo) { /* best effort */ }
                    continue;
                }
                if (fate == 2) {
                    unsigned char noise[SECTOR];
                    for (int b = 0; b < hi - lo; b++) noise[b] = (unsigned char)next_random();
                    if (pwrite(fd, noise, (size_t)(hi - lo), lo) != hi - lo) { /* best effort */ }
                }
                if (keptCount == keptCapacity) {
                    keptCapacity = keptCapacity ? keptCapacity * 2 : 256;
                    kept = realloc(kept, sizeof(int64_t) * (size_t)keptCapacity);
                }
                kept[keptCount++] = s;
                if (hi > keptEnd) keptEnd = hi;
            }
            // A dropped write that grew the file takes the growth back, unless a newer kept
            // write lies past it.
            if (choice == 1 && w->oldSize < end) {
                sqlite3_int64 size = w->oldSize > keptEnd ? w->oldSize : keptEnd;
                if (lseek(fd, 0, SEEK_END) > size && ftruncate(fd, size) != 0) { /* best effort */ }
            }
        }
        free(kept);
        close(fd);
        forget_writes(file);
    }
}

// Counts a watched operation; true when it is the one the power cuts at (it then fails).
static int counts_as_cut(void) {
    operations++;
    if (cutAt > 0 && operations == cutAt) {
        cut_power();
        return 1;
    }
    return 0;
}

static int plClose(sqlite3_file *f) {
    PLFile *p = (PLFile *)f;
    return p->real->pMethods->xClose(p->real);
}

static int plRead(sqlite3_file *f, void *buffer, int amount, sqlite3_int64 offset) {
    PLFile *p = (PLFile *)f;
    if (p->watched) {
        pthread_mutex_lock(&lock);
        int cut = hasCut;
        pthread_mutex_unlock(&lock);
        if (cut) return SQLITE_IOERR_READ;
    }
    return p->real->pMethods->xRead(p->real, buffer, amount, offset);
}

static int plWrite(sqlite3_file *f, const void *buffer, int amount, sqlite3_int64 offset) {
    PLFile *p = (PLFile *)f;
    if (!p->watched) return p->real->pMethods->xWrite(p->real, buffer, amount, offset);
    pthread_mutex_lock(&lock);
    if (hasCut || counts_as_cut()) { pthread_mutex_unlock(&lock); return SQLITE_IOERR_WRITE; }
    SavedWrite w = { .offset = offset, .length = amount, .isTruncate = 0 };
    p->real->pMethods->xFileSize(p->real, &w.oldSize);
    w.old = calloc(1, (size_t)amount);
    // A short read (past the end) fills the rest with zeros, which is what "old" means there.
    p->real->pMethods->xRead(p->real, w.old, amount, offset);
    int rc = p->real->pMethods->xWrite(p->real, buffer, amount, offset);
    if (rc == SQLITE_OK) save(p->watched, w); else free(w.old);
    pthread_mutex_unlock(&lock);
    return rc;
}

static int plTruncate(sqlite3_file *f, sqlite3_int64 size) {
    PLFile *p = (PLFile *)f;
    if (!p->watched) return p->real->pMethods->xTruncate(p->real, size);
    pthread_mutex_lock(&lock);
    if (hasCut || counts_as_cut()) { pthread_mutex_unlock(&lock); return SQLITE_IOERR_TRUNCATE; }
    SavedWrite w = { .offset = size, .isTruncate = 1 };
    p->real->pMethods->xFileSize(p->real, &w.oldSize);
    w.length = w.oldSize > size ? w.oldSize - size : 0;
    w.old = calloc(1, (size_t)(w.length ? w.length : 1));
    if (w.length) p->real->pMethods->xRead(p->real, w.old, (int)w.length, size);
    int rc = p->real->pMethods->xTruncate(p->real, size);
    if (rc == SQLITE_OK && w.length) save(p->watched, w); else free(w.old);
    pthread_mutex_unlock(&lock);
    return rc;
}

static int plSync(sqlite3_file *f, int flags) {
    PLFile *p = (PLFile *)f;
    if (!p->watched) return p->real->pMethods->xSync(p->real, flags);
    pthread_mutex_lock(&lock);
    if (hasCut || counts_as_cut()) { pthread_mutex_unlock(&lock); return SQLITE_IOERR_FSYNC; }
    int rc = SQLITE_OK;
    if (!ignoreSyncs) {
        rc = p->real->pMethods->xSync(p->real, flags);
        // What an fsync returned from is durable: nothing of it is left to the cut.
        if (rc == SQLITE_OK) forget_writes(p->watched);
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

static int plFileSize(sqlite3_file *f, sqlite3_int64 *size) {
    PLFile *p = (PLFile *)f;
    if (p->watched && powerloss_has_cut()) return SQLITE_IOERR_FSTAT;
    return p->real->pMethods->xFileSize(p->real, size);
}

static int plLock(sqlite3_file *f, int level) {
    PLFile *p = (PLFile *)f;
    if (p->watched && powerloss_has_cut()) return SQLITE_IOERR_LOCK;
    return p->real->pMethods->xLock(p->real, level);
}

// Unlocking, shared memory and closing stay possible after the cut, so connections can close.
static int plUnlock(sqlite3_file *f, int level) { PLFile *p = (PLFile *)f; return p->real->pMethods->xUnlock(p->real, level); }
static int plCheckReservedLock(sqlite3_file *f, int *out) { PLFile *p = (PLFile *)f; return p->real->pMethods->xCheckReservedLock(p->real, out); }
static int plFileControl(sqlite3_file *f, int op, void *arg) { PLFile *p = (PLFile *)f; return p->real->pMethods->xFileControl(p->real, op, arg); }
static int plSectorSize(sqlite3_file *f) { PLFile *p = (PLFile *)f; return p->real->pMethods->xSectorSize(p->real); }
static int plDeviceCharacteristics(sqlite3_file *f) { PLFile *p = (PLFile *)f; return p->real->pMethods->xDeviceCharacteristics(p->real); }
static int plShmMap(sqlite3_file *f, int region, int size, int extend, void volatile **out) {
    PLFile *p = (PLFile *)f;
    return p->real->pMethods->xShmMap(p->real, region, size, extend, out);
}
static int plShmLock(sqlite3_file *f, int offset, int n, int flags) { PLFile *p = (PLFile *)f; return p->real->pMethods->xShmLock(p->real, offset, n, flags); }
static void plShmBarrier(sqlite3_file *f) { PLFile *p = (PLFile *)f; p->real->pMethods->xShmBarrier(p->real); }
static int plShmUnmap(sqlite3_file *f, int deleteFlag) { PLFile *p = (PLFile *)f; return p->real->pMethods->xShmUnmap(p->real, deleteFlag); }
static int plFetch(sqlite3_file *f, sqlite3_int64 offset, int amount, void **out) {
    PLFile *p = (PLFile *)f;
    // No memory-mapped reads of watched files: they would bypass the refusal after the cut.
    if (p->watched || p->real->pMethods->iVersion < 3) { *out = 0; return SQLITE_OK; }
    return p->real->pMethods->xFetch(p->real, offset, amount, out);
}
static int plUnfetch(sqlite3_file *f, sqlite3_int64 offset, void *page) {
    PLFile *p = (PLFile *)f;
    if (p->watched || p->real->pMethods->iVersion < 3) return SQLITE_OK;
    return p->real->pMethods->xUnfetch(p->real, offset, page);
}

static const sqlite3_io_methods methods = {
    3, plClose, plRead, plWrite, plTruncate, plSync, plFileSize, plLock, plUnlock,
    plCheckReservedLock, plFileControl, plSectorSize, plDeviceCharacteristics,
    plShmMap, plShmLock, plShmBarrier, plShmUnmap, plFetch, plUnfetch,
};

static int plOpen(sqlite3_vfs *vfs, sqlite3_filename name, sqlite3_file *f, int flags, int *outFlags) {
    (void)vfs;
    PLFile *p = (PLFile *)f;
    p->real = (sqlite3_file *)&p[1];
    pthread_mutex_lock(&lock);
    p->watched = watched_file(name);
    int cut = hasCut;
    pthread_mutex_unlock(&lock);
    if (p->watched && cut) { f->pMethods = 0; return SQLITE_CANTOPEN; }
    int rc = realVFS->xOpen(realVFS, name, p->real, flags, outFlags);
    // SQLite calls xClose whenever pMethods is set, even after a failed open: mirror the real file.
    f->pMethods = p->real->pMethods ? &methods : 0;
    return rc;
}

static int plDelete(sqlite3_vfs *vfs, const char *name, int syncDirectory) {
    (void)vfs;
    pthread_mutex_lock(&lock);
    WatchedFile *file = watched_file(name);
    if (file && hasCut) { pthread_mutex_unlock(&lock); return SQLITE_IOERR_DELETE; }
    if (file) forget_writes(file);
    pthread_mutex_unlock(&lock);
    return realVFS->xDelete(realVFS, name, syncDirectory);
}

static int plAccess(sqlite3_vfs *v, const char *n, int flags, int *out) { (void)v; return realVFS->xAccess(realVFS, n, flags, out); }
static int plFullPathname(sqlite3_vfs *v, const char *n, int size, char *out) { (void)v; return realVFS->xFullPathname(realVFS, n, size, out); }
static void *plDlOpen(sqlite3_vfs *v, const char *n) { (void)v; return realVFS->xDlOpen(realVFS, n); }
static void plDlError(sqlite3_vfs *v, int n, char *out) { (void)v; realVFS->xDlError(realVFS, n, out); }
static void (*plDlSym(sqlite3_vfs *v, void *h, const char *s))(void) { (void)v; return realVFS->xDlSym(realVFS, h, s); }
static void plDlClose(sqlite3_vfs *v, void *h) { (void)v; realVFS->xDlClose(realVFS, h); }
static int plRandomness(sqlite3_vfs *v, int n, char *out) { (void)v; return realVFS->xRandomness(realVFS, n, out); }
static int plSleep(sqlite3_vfs *v, int us) { (void)v; return realVFS->xSleep(realVFS, us); }
static int plCurrentTime(sqlite3_vfs *v, double *out) { (void)v; return realVFS->xCurrentTime(realVFS, out); }
static int plGetLastError(sqlite3_vfs *v, int n, char *out) { (void)v; return realVFS->xGetLastError ? realVFS->xGetLastError(realVFS, n, out) : 0; }
static int plCurrentTimeInt64(sqlite3_vfs *v, sqlite3_int64 *out) { (void)v; return realVFS->xCurrentTimeInt64(realVFS, out); }

static sqlite3_vfs vfs = {
    2, 0, 0, 0, "powerloss", 0,
    plOpen, plDelete, plAccess, plFullPathname, plDlOpen, plDlError, plDlSym, plDlClose,
    plRandomness, plSleep, plCurrentTime, plGetLastError, plCurrentTimeInt64,
    0, 0, 0,
};

int powerloss_install(void) {
    pthread_mutex_lock(&lock);
    int rc = SQLITE_OK;
    if (!realVFS) {
        sqlite3_initialize();
        sqlite3_vfs *base = sqlite3_vfs_find(0);
        vfs.szOsFile = (int)sizeof(PLFile) + base->szOsFile;
        vfs.mxPathname = base->mxPathname;
        realVFS = base;
        rc = sqlite3_vfs_register(&vfs, 1);
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

void powerloss_arm(const char *directory, uint64_t seed, int64_t cut) {
    pthread_mutex_lock(&lock);
    forget_all();
    free(armedDirectory);
    armedDirectory = strdup(directory);
    rngState = seed;
    cutAt = cut;
    operations = 0;
    hasCut = 0;
    ignoreSyncs = 0;
    memset(&outcome, 0, sizeof outcome);
    pthread_mutex_unlock(&lock);
}

void powerloss_disarm(void) {
    pthread_mutex_lock(&lock);
    forget_all();
    free(armedDirectory);
    armedDirectory = 0;
    hasCut = 0;
    cutAt = 0;
    pthread_mutex_unlock(&lock);
}

int powerloss_has_cut(void) {
    pthread_mutex_lock(&lock);
    int cut = hasCut;
    pthread_mutex_unlock(&lock);
    return cut;
}

int64_t powerloss_operations(void) {
    pthread_mutex_lock(&lock);
    int64_t n = operations;
    pthread_mutex_unlock(&lock);
    return n;
}

powerloss_outcome powerloss_last_outcome(void) {
    pthread_mutex_lock(&lock);
    powerloss_outcome o = outcome;
    pthread_mutex_unlock(&lock);
    return o;
}

void powerloss_set_ignore_syncs(int ignore) {
    pthread_mutex_lock(&lock);
    ignoreSyncs = ignore;
    pthread_mutex_unlock(&lock);
}
