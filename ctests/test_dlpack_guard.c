/* A file that includes dlpack.h (or ATen/dlpack.h) before stoker.h uses dlpack.h's types:
 * stoker.h defines its DLPack 1.0 types only when DLPACK_DLPACK_H_ is not defined. The official
 * header is not vendored here; this stands in for it with its include guard and DLPack 1.0
 * definitions (field for field, from dlpack.h v1.0). */
#include <stdint.h>

#ifndef DLPACK_DLPACK_H_
#define DLPACK_DLPACK_H_
#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 0
typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;
typedef enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 } DLDeviceType;
typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;
typedef enum { kDLInt = 0U, kDLUInt = 1U, kDLFloat = 2U, kDLBfloat = 4U } DLDataTypeCode;
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;
typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;
#endif

#include "testutil.h" /* includes stoker.h: no redefinition errors */

int main(void) {
  /* stoker's functions take dlpack.h's type. */
  stoker_status (*export_fn)(stoker_batch *, size_t, DLManagedTensorVersioned **) =
      stoker_batch_to_dlpack;
  DLManagedTensorVersioned *d = (DLManagedTensorVersioned *)&d;
  CHECK_STATUS(export_fn(NULL, 0, &d), STOKER_ERR_INVALID_ARGUMENT);
  CHECK(d == NULL);
  return t_finish("test_dlpack_guard");
}
