// The resize of GPU decoding (`jpeg_decoder=gpu`/`auto`): a JPEG decoded on the device, an RGB8
// image of interleaved pixels, becomes its sample's uint8 slot there, resampled, clipped and
// flipped as the CPU path's plan says. The host computes the resampling taps (`transform/taps.rs`,
// `Taps::for_axis`: each output column's and row's first source pixel, how many it reads, and
// their weights) and sends them with the batch, so the kernel only multiplies and adds, in an
// order fixed by the contract: its output is the host reference's (`resize::run_on_host`) bit
// for bit.
//
// Contract. Output pixel (x, y) is resampled pixel (u, y), u = flip ? width - 1 - x : x. With
// [fx, nx] = x_spans[u] and [fy, ny] = y_spans[y], channel c of it is
//     round(Σ_{j < ny} y_weights[y * y_taps + j] · h(fy + j)), where
//     h(r) = round(Σ_{k < nx} x_weights[u * x_taps + k] · src[r * pitch + (fx + k) * 3 + c])
// and pitch = src_width * 3, each sum a chain of fused multiply-adds (`__fmaf_rn`, rounded once
// each) from 0.0f in tap order, and round(v) = floor(v + 0.5f) clamped to 0..255: the horizontal
// pass is rounded to uint8 before the vertical one, as the CPU's two passes are. It is stored at
// dst[c * width * height + y * width + x] when planar, else at dst[(y * width + x) * 3 + c].
// Nothing else of dst is written, and src is read only where the spans point.
//
// Parameters, in the order the library passes them (`resize_async` in driver.rs), each a u64
// (pointer) or a u32:
//     src (u64), src_width, src_height (u32), dst (u64), width, height (u32),
//     planar, flip (u32, 0 or 1), x_spans, x_weights (u64), x_taps (u32),
//     y_spans, y_weights (u64), y_taps (u32).
// Spans are u32 pairs [first, count], one per output column (x) or row (y); weights are f32,
// `taps` per output column or row. src_height bounds the y spans and is not read.
//
// One thread per output pixel writes its three channels; output columns go along the grid's x
// dimension and rows along y, both strided, so any size runs on any grid (the library's is
// `resize::grid`, blocks of `RESIZE_BLOCK`). Pixel indices are 32-bit (image sides are far below
// 2^31, so a strided index never wraps); byte offsets are 64-bit.
//
// Compiled to PTX ahead of time (`make_ptx.py`) and embedded in the library, like cast.cu (which
// says why). `check_kernels.py` runs this kernel on the CPU (`emulate_resize.cpp`) and assembles
// the PTX.

// floor(v + 0.5) clamped to a byte, as `to_u8` in resize.rs (a NaN, which fmaxf drops, gives 0
// there too).
__device__ __forceinline__ unsigned char resize_to_u8(float v) {
    return (unsigned char)fminf(fmaxf(floorf(v + 0.5f), 0.0f), 255.0f);
}

extern "C" __global__ void stoker_resize_u8(const unsigned char* __restrict__ src,
                                            unsigned int src_width,
                                            unsigned int /* src_height */,
                                            unsigned char* __restrict__ dst, unsigned int width,
                                            unsigned int height, unsigned int planar,
                                            unsigned int flip,
                                            const unsigned int* __restrict__ x_spans,
                                            const float* __restrict__ x_weights,
                                            unsigned int x_taps,
                                            const unsigned int* __restrict__ y_spans,
                                            const float* __restrict__ y_weights,
                                            unsigned int y_taps) {
    const unsigned long long pitch = (unsigned long long)src_width * 3u;
    const unsigned long long plane = (unsigned long long)width * height;
    const unsigned int step_x = gridDim.x * blockDim.x;
    const unsigned int step_y = gridDim.y * blockDim.y;
    for (unsigned int y = blockIdx.y * blockDim.y + threadIdx.y; y < height; y += step_y) {
        const unsigned int fy = y_spans[2ull * y];
        const unsigned int ny = y_spans[2ull * y + 1];
        const float* wy = y_weights + (unsigned long long)y * y_taps;
        for (unsigned int x = blockIdx.x * blockDim.x + threadIdx.x; x < width; x += step_x) {
            const unsigned int u = flip ? width - 1u - x : x;
            const unsigned int fx = x_spans[2ull * u];
            const unsigned int nx = x_spans[2ull * u + 1];
            const float* wx = x_weights + (unsigned long long)u * x_taps;
            // The three channels side by side: each has its own chain, in tap order.
            float acc0 = 0.0f, acc1 = 0.0f, acc2 = 0.0f;
            for (unsigned int j = 0; j < ny; j++) {
                const unsigned char* p = src + (unsigned long long)(fy + j) * pitch +
                                         (unsigned long long)fx * 3u;
                float h0 = 0.0f, h1 = 0.0f, h2 = 0.0f;
                for (unsigned int k = 0; k < nx; k++, p += 3) {
                    const float w = wx[k];
                    h0 = __fmaf_rn(w, (float)p[0], h0);
                    h1 = __fmaf_rn(w, (float)p[1], h1);
                    h2 = __fmaf_rn(w, (float)p[2], h2);
                }
                const float w = wy[j];
                acc0 = __fmaf_rn(w, (float)resize_to_u8(h0), acc0);
                acc1 = __fmaf_rn(w, (float)resize_to_u8(h1), acc1);
                acc2 = __fmaf_rn(w, (float)resize_to_u8(h2), acc2);
            }
            const unsigned long long pixel = (unsigned long long)y * width + x;
            if (planar) {
                dst[pixel] = resize_to_u8(acc0);
                dst[plane + pixel] = resize_to_u8(acc1);
                dst[2 * plane + pixel] = resize_to_u8(acc2);
            } else {
                unsigned char* d = dst + pixel * 3u;
                d[0] = resize_to_u8(acc0);
                d[1] = resize_to_u8(acc1);
                d[2] = resize_to_u8(acc2);
            }
        }
    }
}
