/* Loading libstoker at run time, as Python (ctypes/cffi) and other runtimes do: dlopen, dlsym,
 * check the ABI version, run one epoch. Usage: test_dlopen PATH/TO/libstoker.so */
#include <dlfcn.h>

#include "testutil.h" /* types and the npy writer; this program does not link libstoker */

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s PATH/TO/libstoker.so\n", argv[0]);
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  /* dlsym returns an object pointer; POSIX guarantees it converts to a function pointer. */
  union {
    void *obj;
    uint32_t (*fn)(void);
  } abi = {dlsym(lib, "stoker_abi_version")};
  CHECK(abi.obj != NULL);
  if (!abi.obj) return t_finish("test_dlopen");
  CHECK(abi.fn() == STOKER_ABI_VERSION);

  t_tmp tmp;
  t_tmp_init(&tmp);
  char source[600];
  t_write_dataset(&tmp, 9, source, NULL, sizeof source);

  typedef stoker_options *(*options_new_fn)(void);
  typedef stoker_status (*options_set_fn)(stoker_options *, const char *, const char *);
  typedef void (*options_free_fn)(stoker_options *);
  typedef stoker_status (*loader_new_fn)(const stoker_options *, stoker_loader **);
  typedef stoker_status (*loader_next_fn)(stoker_loader *, stoker_batch **);
  typedef void (*loader_free_fn)(stoker_loader *);
  typedef stoker_status (*batch_field_fn)(const stoker_batch *, size_t, stoker_tensor *);
  typedef void (*batch_release_fn)(stoker_batch *);
  typedef size_t (*last_error_fn)(char *, size_t);
#define SYM(type, name) type name = (type)(uintptr_t)dlsym(lib, "stoker_" #name); CHECK(name != NULL)
  SYM(options_new_fn, options_new);
  SYM(options_set_fn, options_set);
  SYM(options_free_fn, options_free);
  SYM(loader_new_fn, loader_new);
  SYM(loader_next_fn, loader_next);
  SYM(loader_free_fn, loader_free);
  SYM(batch_field_fn, batch_field);
  SYM(batch_release_fn, batch_release);
  SYM(last_error_fn, last_error);
  if (t_failures) return t_finish("test_dlopen");

  stoker_options *o = options_new();
  CHECK(options_set(o, "source", source) == STOKER_OK);
  CHECK(options_set(o, "batch_size", "4") == STOKER_OK);
  CHECK(options_set(o, "bogus", "1") == STOKER_ERR_INVALID_ARGUMENT);
  char msg[256];
  CHECK(last_error(msg, sizeof msg) > 0 && strstr(msg, "`bogus`") != NULL);
  stoker_loader *l = NULL;
  CHECK(loader_new(o, &l) == STOKER_OK);
  options_free(o);
  int batches = 0, samples = 0;
  stoker_batch *b = NULL;
  stoker_status s;
  while ((s = loader_next(l, &b)) == STOKER_OK) {
    stoker_tensor t;
    CHECK(batch_field(b, 0, &t) == STOKER_OK);
    samples += (int)t.shape[0];
    batches++;
    batch_release(b);
  }
  CHECK(s == STOKER_END_OF_EPOCH);
  CHECK(batches == 3 && samples == 9);
  loader_free(l);
  t_tmp_cleanup(&tmp);
  dlclose(lib);
  return t_finish("test_dlopen");
}
