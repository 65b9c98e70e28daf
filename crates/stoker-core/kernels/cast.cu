// The device half of `gpu_normalize`: a batch's uint8 image field, copied to the device as is,
// becomes the loader's float output there. Each element is looked up in the table the CPU path
// uses (`table[channel * 256 + value]`, the normalisation and the type conversion precomputed on
// the host in f64 and rounded once), so the device writes the very bits the CPU would: the kernel
// moves bits and computes nothing.
//
// The field is seen as `rows` rows of `plane` elements: NCHW `[B, C, H, W]` is `B * C` rows of
// `H * W`, a row's channel being `row % channels`; NHWC `[B, H, W, C]` is `B` rows of
// `H * W * C`, an element's channel being `column % channels`. Rows go along the grid's y
// dimension and columns along x, both strided, so any size runs on any grid, and every index
// stays 32-bit: the host refuses planes and row counts of 2^31 or more, so a strided index
// (at most 2^31 + 65,535 x 256) never wraps.
//
// Compiled to PTX ahead of time (`make_ptx.py`) and embedded in the library, which hands it to
// the driver to compile for the GPU at hand: a build of stoker needs no CUDA toolkit.
// `check_kernels.py` runs these kernels on the CPU (`emulate_cast.cpp`) and assembles the PTX.

template <typename T>
__device__ void cast_rows(const unsigned char* __restrict__ src, T* __restrict__ dst,
                          const T* __restrict__ table, unsigned int rows, unsigned int plane,
                          unsigned int channels, unsigned int channel_by_column) {
    const unsigned int step = gridDim.x * blockDim.x;
    for (unsigned int row = blockIdx.y; row < rows; row += gridDim.y) {
        const unsigned char* s = src + (unsigned long long)row * plane;
        T* d = dst + (unsigned long long)row * plane;
        const T* row_table = table + (row % channels) * 256u;
        for (unsigned int col = blockIdx.x * blockDim.x + threadIdx.x; col < plane; col += step) {
            const T* t = channel_by_column ? table + (col % channels) * 256u : row_table;
            d[col] = t[s[col]];
        }
    }
}

// float32 output: the table holds each float's bits.
extern "C" __global__ void stoker_cast_u8_b32(const unsigned char* src, unsigned int* dst,
                                              const unsigned int* table, unsigned int rows,
                                              unsigned int plane, unsigned int channels,
                                              unsigned int channel_by_column) {
    cast_rows(src, dst, table, rows, plane, channels, channel_by_column);
}

// float16 and bfloat16 output: the table holds each half's bits.
extern "C" __global__ void stoker_cast_u8_b16(const unsigned char* src, unsigned short* dst,
                                              const unsigned short* table, unsigned int rows,
                                              unsigned int plane, unsigned int channels,
                                              unsigned int channel_by_column) {
    cast_rows(src, dst, table, rows, plane, channels, channel_by_column);
}
