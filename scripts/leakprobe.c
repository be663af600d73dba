/* A Redis module that leaks one block and writes one byte past another, on
 * purpose. `make leakcheck` loads it into a valgrind-run redis-server first,
 * to prove that valgrind sees allocations made through RedisModule_Alloc
 * (which FLOCK's Rust allocator uses) on this machine. Debian's redis-server
 * is built with jemalloc, but it imports plain malloc/free from
 * libjemalloc.so.2, so valgrind's replacements take them over: memcheck
 * tracks every zmalloc block, the module's included.
 *
 * No redismodule.h: the API is reached through the function the server
 * passes as the first field of the context, as RedisModule_Init does. */
#include <stddef.h>
#include <string.h>

typedef int (*get_api_fn)(const char *name, void *out);
typedef void *(*alloc_fn)(size_t size);
typedef void (*free_fn)(void *ptr);

__attribute__((noinline)) static void leakprobe_leak(alloc_fn alloc) {
    char *block = alloc(4242);
    memset(block, 1, 4242);
}

__attribute__((noinline)) static void leakprobe_overflow(alloc_fn alloc, free_fn release) {
    volatile char *block = alloc(16);
    block[16] = 1;
    release((void *)block);
}

int RedisModule_OnLoad(void *ctx, void **argv, int argc) {
    (void)argv;
    (void)argc;
    get_api_fn get_api = *(get_api_fn *)ctx;
    int (*set_attribs)(void *, const char *, int, int);
    alloc_fn alloc;
    free_fn release;
    if (get_api("RedisModule_SetModuleAttribs", &set_attribs) || get_api("RedisModule_Alloc", &alloc) ||
        get_api("RedisModule_Free", &release))
        return 1;
    set_attribs(ctx, "leakprobe", 1, 1);
    leakprobe_leak(alloc);
    leakprobe_overflow(alloc, release);
    return 0;
}
