/* No-op stand-ins for libcudart.so.13 and libcupti.so.13, used ONLY by the tests and the example
 * trainer to load the PyPI wheel's libtorch_cpu.so on a machine without CUDA (that library names
 * both in DT_NEEDED, for its CUDA device query and the Kineto profiler). Every function reports
 * failure: cudaGetDeviceCount says there is no device, CUPTI is "not initialized".
 * Built once as libcudart.so.13 (-DSTOKER_STUB_cudart) and once as libcupti.so.13. */
#include <stddef.h>

#if defined(STOKER_STUB_cudart)
enum { cudaErrorNoDevice = 100 };
int cudaGetDeviceCount(int* count) {
  if (count) *count = 0;
  return cudaErrorNoDevice;
}
int cudaDriverGetVersion(int* version) {
  if (version) *version = 0;
  return 0;
}
int cudaRuntimeGetVersion(int* version) {
  if (version) *version = 0;
  return 0;
}
const char* cudaGetErrorString(int error) {
  (void)error;
  return "CUDA is not available (stoker test stub of libcudart)";
}
int cudaDeviceSynchronize(void) { return cudaErrorNoDevice; }
int cudaGetDeviceProperties(void* prop, int device) {
  (void)prop;
  (void)device;
  return cudaErrorNoDevice;
}
#elif defined(STOKER_STUB_cupti)
enum { CUPTI_ERROR_NOT_INITIALIZED = 15 };
#define STUB(name) \
  int name(void) { return CUPTI_ERROR_NOT_INITIALIZED; }
STUB(cuptiActivityDisable)
STUB(cuptiActivityEnable)
STUB(cuptiActivityEnableCudaEventDeviceTimestamps)
STUB(cuptiActivityEnableDriverApi)
STUB(cuptiActivityEnableRuntimeApi)
STUB(cuptiActivityFlushAll)
STUB(cuptiActivityGetNextRecord)
STUB(cuptiActivityGetNumDroppedRecords)
STUB(cuptiActivityPopExternalCorrelationId)
STUB(cuptiActivityPushExternalCorrelationId)
STUB(cuptiActivityRegisterCallbacks)
STUB(cuptiActivityRegisterTimestampCallback)
STUB(cuptiActivitySetAttribute)
STUB(cuptiEnableCallback)
STUB(cuptiEnableDomain)
STUB(cuptiFinalize)
STUB(cuptiSubscribe)
STUB(cuptiUnsubscribe)
int cuptiGetVersion(unsigned* version) {
  if (version) *version = 0;
  return CUPTI_ERROR_NOT_INITIALIZED;
}
int cuptiGetResultString(int result, const char** str) {
  (void)result;
  if (str) *str = "CUPTI is not available (stoker test stub)";
  return 0;
}
int cuptiGetCallbackName(int domain, unsigned cbid, const char** name) {
  (void)domain;
  (void)cbid;
  if (name) *name = "unavailable";
  return CUPTI_ERROR_NOT_INITIALIZED;
}
#endif
