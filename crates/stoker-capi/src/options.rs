//! `stoker_options`: string keys, validated when set.

use crate::error::fail;
use crate::ffi::{free_raw, into_raw};
use crate::types::{stoker_launch, stoker_options, stoker_status};
use stoker_core::LoaderOptions;

/// New options with the documented defaults; free with `stoker_options_free`. NULL only if
/// memory ran out.
#[no_mangle]
pub extern "C" fn stoker_options_new() -> *mut stoker_options {
    ffi_boundary!(stoker_options_new => {
        into_raw(stoker_options {
            inner: LoaderOptions::new(),
        })
    })
}

/// Sets option `key` to `value`. An unknown key or a malformed value gives
/// `STOKER_ERR_INVALID_ARGUMENT` with a message naming the key, and leaves the options unchanged.
///
/// Option keys (generated from the core's key table, `stoker_core::options::OPTIONS`):
/// <!-- options:begin -->
/// | key | values | default | example | meaning |
/// |---|---|---|---|---|
/// | `source` | `npy:PATH`, `image_folder:ROOT`, `segmentation_folder:ROOT`, `coco:ANNOTATIONS`, `coco_masks:ANNOTATIONS`, `tar:PATTERN`, `packed:PATH`, `megatron:PREFIX[,PREFIX…]`, `tokens:PATTERN`, `parquet:PATTERN` | required | `npy:/data/x.npy` | an npy array (memory-mapped; uint8, uint16, int32, int64, float16, float32), one subfolder per class of `.jpg/.jpeg/.png` files (torchvision's ImageFolder rules), or images and their PNG masks in twin trees (`ROOT/images/DIRS/NAME.jpg` with `ROOT/masks/DIRS/NAME.png`, at any depth: fields `image` and `mask`), or a COCO `instances_*.json` with its images (`ROOT/annotations/instances_NAME.json` reads `ROOT/NAME/`: fields `image`, `boxes` (xywh), `labels`, and with `coco_masks:` a semantic `mask`), or WebDataset tar shards (`train-{000..146}.tar`, globs, comma lists, or a WebDataset `wids` shard index `….json` listing shards with their sample counts; `.tar.gz` when streaming), or stoker's packed format (`stoker pack`: a file, a dataset directory or a pattern of shards; remote: a dataset URL ending in `/` or `index.stkidx`, or shard URLs), or a token stream for language models (see docs/llm.md): Megatron-LM indexed datasets (`PREFIX.idx` + `PREFIX.bin`, several prefixes or a brace range) or flat token files (raw `.bin` of `token_dtype`, or 1-D `.npy` of uint16, uint32 or int32), memory-mapped and checked at open, or Parquet files: a table of images and numbers, a row a sample (`columns`; Hugging Face image datasets), or with `tokenizer` text, a row a document (`text_column` tokenized in the workers); custom, callback and iterable sources are set in code |
/// | `labels` | `npy:PATH` | none | `npy:/data/y.npy` | integer labels for an npy source (field `label`, int64) |
/// | `batch_size` | integer 1..=16777216 | 1 | `64` | samples per batch |
/// | `shuffle` | bool | false | `true` | a new permutation every epoch, a function of (seed, epoch) only |
/// | `seed` | u64 | 0 | `18446744073709551615` | all randomness (order and augmentation) derives from it; the same on every rank, so ranks agree on the order |
/// | `drop_last` | bool | false | `true` | drop the incomplete final batch |
/// | `num_workers` | integer 0..=1024, `auto` | `auto` | `3` | worker threads (`auto`: the cores of this process's affinity mask divided by the ranks on this node, at least 1; 0: the calling thread) |
/// | `prefetch_factor` | integer 1..=1024 | 2 | `4` | batches in flight = max(1, num_workers) × prefetch_factor |
/// | `in_order` | bool | true | `false` | false lets ready batches overtake (never across epochs); each rank's saved state is then its own (it names the rank) and resumes that rank only |
/// | `rank` | integer, `auto` (`env` is an alias) | `auto` | `1` | this process's rank: the epoch's global order is padded by repeating its head and rank r takes `order[r::world_size]`; `auto`: from torchrun, Slurm, Open MPI or PMI variables, else 0 |
/// | `world_size` | integer ≥ 1, `auto` (`env` is an alias) | `auto` | `4` | number of ranks (`auto`: from the launcher's variables, else 1); every sampler is dealt to ranks, each getting the same number of batches |
/// | `shard_drop_last` | bool | false | `true` | distributed: drop the tail instead of padding every rank to the same length |
/// | `replacement` | bool | false | `true` | `RandomSampler(replacement=True)` |
/// | `num_samples` | integer ≥ 1 | dataset size | `1000` | samples per epoch of the random and weighted samplers; of an iterable source, the epoch's total over all ranks (each rank delivers `ceil(N / world_size)`, wrapping its stream around if short) |
/// | `weights` | `w0,w1,...` (finite, ≥ 0) | none | `0.5,1,2` | `WeightedRandomSampler` (with replacement) |
/// | `subset` | `3,5,9` or `0..1000`, mixed | none | `3,5,10..20` | `SubsetRandomSampler`: these indices, shuffled every epoch |
/// | `indices` | `3,5,9` or `0..1000`, mixed | none | `9,3,0..4` | these indices in this order every epoch (a torch `sampler=` given as a sequence) |
/// | `transform` | e.g. `random_resized_crop(224) \| hflip \| normalize(imagenet)` | none | `random_resized_crop(224) \| hflip` | operations separated by `\|`, torchvision v2 semantics: `resize`, `center_crop`, `random_resized_crop`, `scale_jitter`, `random_shortest_size`, `random_crop`, `random_zoom_out`, `random_iou_crop`, `hflip`, `vflip`, `color_jitter`, `random_photometric_distort`, `grayscale`, `gaussian_blur`, `rotate`, `affine`, `rand_augment`, `trivial_augment`, `auto_augment(imagenet)`, `random_erasing`, `normalize`, and batch-level `mixup`, `cutmix` (`label` becomes float32 `[B, N]`) (see docs/transforms.md); a leading `fields(image=NAME, mask=NAME, boxes=NAME:xyxy, labels=NAME, per_box=NAME,NAME, keypoints=NAME, ignore_index=255, min_size=1, min_area=1)` moves a segmentation mask (nearest, labels kept), bounding boxes (clamped, dropped under `min_size` pixels a side or `min_area` with their labels and per-box fields) and keypoints (`x, y[, visibility]` rows, never dropped; visibility 0 once outside) with their image under one draw; run fused, per sample, into the batch slot; a bad spec is an error naming the operation and argument |
/// | `dtype` | `uint8`, `uint16`, `float32`, `float16`, `bfloat16` | float32 after normalize, else uint8 | `bfloat16` | image output element type (other tensors are delivered as stored; image-shaped uint8, uint16, float16, bfloat16 and float32 tensors are images, see `input_layout`; `uint16` only for uint16 tensor images) |
/// | `layout` | `nchw`, `nhwc` | nchw | `nhwc` | image batch layout (an image-shaped tensor field that no `transform`, `dtype` or `layout` is given for is delivered as stored) |
/// | `input_layout` | `hwc`, `chw` | `hwc` if the last dimension is 1, 3 or 4, else `chw` if the first is | `chw` | how an image-shaped tensor field (3 dimensions of uint8, uint16, float16, bfloat16 or float32: npy, tar `npy`, packed tensor fields, callbacks) is stored, so that `transform`, `dtype` and `layout` apply to it as to decoded images; any other channel count (13 bands: `[H, W, 13]`) needs it set, and a layout the shape contradicts (`hwc` on `[3, H, W]`) is refused; RGB uint8 goes through the RGB pipeline, any other channel count or a float type plane by plane (colour ops need RGB uint8); its size is known, so `dtype` or `layout` alone converts it and the transform need not fix a size; from callbacks, RGB uint8 images may vary in size from sample to sample when the transform fixes the output size, and with them the `[H, W]` integer mask `fields(mask=)` names (given after its image) |
/// | `pin_memory` | bool | true with cuda | `true` | page-locked batch memory: registered with the CUDA driver where one is present (what torch calls pinned: `is_pinned()`, asynchronous `.cuda(non_blocking=True)`), else `mlock`; on cuda, registered with the loader's device |
/// | `device` | `cpu`, `cuda`, `cuda:N` | cpu | `cuda:1` | where batches are delivered (CUDA prefetch); `cuda` is `cuda:LOCAL_RANK` (the rank on this node) |
/// | `cuda_stream` | a CUstream, decimal or `0x` hex | the loader's own | `0x7f00aa` | device=cuda: copy on the caller's stream (borrowed, never destroyed) |
/// | `gpu_normalize` | bool | true with cuda where the transform allows | `false` | device=cuda: uint8 image fields (RGB, or any channel count) cross to the device as uint8 and a kernel on the copy stream makes them the float output (`dtype`, `layout`, `normalize`), bit-identical to the CPU path (the same per-channel table), 1/4 of float32's bytes over PCIe; not with `random_erasing`, `mixup`/`cutmix` or images stored as uint16 or floats, which convert on the CPU (`true` insists: an error names the field that cannot); no effect on uint8 output; `true` with device=cpu is refused |
/// | `on_error` | `raise`, `skip` | raise | `skip` | bad sample: an error naming it, or a deterministic replacement counted in stats |
/// | `timeout_ms` | integer ≥ 0 | 0 (none) | `1500` | longest wait for one batch |
/// | `resume_state` | a string from `save_state` | none | `stoker-state-v1;seed=3;epoch=1;position=2;ahead=4;batches=6` | continue exactly where a saved job stopped, at any world size (a streaming loader's state: at the same world size only, by replay), with the seed it was saved with (whatever `seed` says); an error names what differs if the source, sampler, batch_size, drop_last or transform changed |
/// | `pad` | a finite number | none | `-1` | pad ragged fields to the batch's longest, with a `<name>_lengths` field |
/// | `ragged` | `pad`, `offsets` | pad | `offsets` | ragged per-sample fields (boxes, tar raw members, `cu_seqlens`, varying callback tensors): `pad` pads them to the batch's longest, `[batch, longest, …]`, with an int64 `<name>_lengths` of `batch` (needs `pad` unless raw bytes); `offsets` lays the samples' rows end to end, `[total, …]`, with an int64 `<name>_offsets` of `batch + 1` (sample `i` is rows `offsets[i]..offsets[i+1]`: `torch.nested.nested_tensor_from_jagged(values, offsets)`) |
/// | `box_format` | `xyxy`, `xywh`, `cxcywh` | xyxy | `cxcywh` | how the boxes a `fields(boxes=NAME)` transform role names are stored and delivered (pixels: left, top, right, bottom; left, top, width, height; centre x, centre y, width, height); a `boxes=NAME:FORMAT` suffix in the spec wins over it |
/// | `max_image_pixels` | integer ≥ 1 | 89478485 | `1000000` | larger images are bad samples (decompression bombs), refused before allocating |
/// | `jpeg_decoder` | `auto`, `zune`, `turbo`, `gpu` | `auto` (or `STOKER_JPEG_DECODER`) | `zune` | `turbo`: libjpeg-turbo decodes only the rows and columns a crop reads, shrinking in the DCT domain (by 1/2, 1/4 or 1/8) while the crop stays at least 6 times the output, so that the resample after it still shrinks by 3 or more; `zune`: zune-jpeg (pure Rust) decodes whole images; `auto`: `turbo` when it was built with SIMD, else `zune`; `gpu` (device=cuda): the device decodes the JPEGs with nvJPEG, loaded at run time (`gpu_decode_share` of them, all by default), the rest as `auto`. CMYK/YCCK JPEGs always go to zune-jpeg; stats count each path (`decoded_*`) |
/// | `gpu_decode_share` | `0`..`1`, `auto` | `auto`: all with `jpeg_decoder=gpu`; with `jpeg_decoder=auto`, none unless `autotune` moves it | `0.25` | device=cuda: the share of samples, chosen by a hash of the index (a run is the same for a given share), whose JPEGs the prefetch thread decodes on the device (nvJPEG) and crops, resizes and flips there with the draws the CPU path would use, into the same slots; needs a transform of `resize`, `center_crop`, `random_resized_crop` and `hflip` only (then `normalize`/`dtype` under `gpu_normalize`); progressive, CMYK and other files the device cannot take are decoded by the workers; stats `gpu_decode_share`, `decoded_device` |
/// | `memory_budget` | bytes (`8GiB`, `500MB`) or `N%` of physical memory | 50% of physical memory (or the cgroup limit) ÷ `LOCAL_WORLD_SIZE` | `8GiB` | bound on the batch memory the loader keeps (in flight and idle): a batch that cannot fit is an error when the loader is made; the in-flight cap is lowered to fit (stats `in_flight_cap`); with `device=cuda` it also holds the device buffers the ring grows by while the trainer holds every one |
/// | `autotune` | bool | false | `true` | live control of the worker count (from 1 with `num_workers=auto`, never beyond the usable cores) and the prefetch depth (up to 8), within the memory budget, and with device=cuda and `jpeg_decoder=auto` of `gpu_decode_share` (up a tenth while every core is busy and the consumer starves, down once it keeps up); every decision is in stats (`autotune_decisions`, `num_workers`, `prefetch_factor`, `gpu_decode_share`) and the trace |
/// | `trace` | a file path | none | `trace.json` | write a Chrome trace-event JSON timeline (Perfetto, chrome://tracing) of every worker's stages, the device copies and the consumer's waits; keeps the last 1024 batches of each thread; written when the loader is dropped |
/// | `shuffle_buffer` | integer 0..=16777216 | 0 | `1000` | tar: 0 = indexed (random access, every sampler); N ≥ 1 = streaming: shards shuffled per (seed, epoch), split across ranks into equal runs, read sequentially through a seeded buffer of N samples; iterable sources: a buffer of N samples (0: stream order) |
/// | `order` | `random`, `quasi_random` | `random` | `quasi_random` | with `shuffle=true`: `quasi_random` is a page-aware shuffle for data larger than RAM or than `parquet_cache`: pages shuffled, then samples shuffled within windows of 32 pages (64 MiB at the packed format's default page size); deterministic and resumable like `random`. Packed files: the files are advised (`madvise`) for the order, sequential, random or read-ahead per page. `parquet:` tables: a page is a row group, or a run of data pages of at least 2 MiB where the file's page index says where they begin |
/// | `fields` | `EXT:NAME,...` (`jpg;png:image,cls:label,txt:caption`) | image + label | `jpg;png:image,cls:label` | tar: members to deliver and their field names; `jpg`/`jpeg`/`png` are decoded images, `cls`/`label`/`index` int64, `npy` tensors, `json#boxes` and `json#labels` a JSON member's `boxes` (float32 rows of 4) and `labels` (int64), anything else raw bytes (uint8, padded with 0, with `NAME_lengths`) |
/// | `columns` | `COLUMN[:NAME],...` (`img:image,label`) | every image and number column, under its name | `img:image,label` | `parquet:` tables (without `tokenizer`): the columns to deliver, a row a sample, and their field names; a binary column or a Hugging Face image (`struct<bytes, path>`) is a decoded image (JPEG or PNG, as tar's `jpg`), an integer column int32 or int64 as stored (uint32 as int64), float and double float32, boolean uint8; text and list columns are not delivered |
/// | `parquet_cache` | bytes (`1GiB`, `0`) | 1GiB | `4GiB` | `parquet:` tables: decompressed data pages kept for the reading threads to share, least recently used dropped first (`0`: none). A shuffled row is read from its page, and a page may hold a whole row group (row groups of 100 images written by pyarrow, as earlier releases of Hugging Face `datasets` wrote image datasets, are a page each); a page is kept on its second decompression within the last `parquet_cache` bytes of them, then read from memory. Holds `order=quasi_random`'s window of pages, or a whole table that fits |
/// | `shard_prefetch` | integer 0..=64 | 2 | `4` | tar or packed with URLs (`s3://`, `gs://`, `az://`, `https://`): remote shards downloaded at once while the loader opens; streaming from a `wids` index (`tar:URL.json`): shards downloading ahead of the one being read (0 is taken as 1) |
/// | `cache_dir` | a directory path | none (a private temporary directory, removed when the loader closes) | `cache` | local cache of remote shards, shared safely by the ranks of a node (file locks; each shard downloaded once); a later loader checks each cached shard's size and ETag with one HEAD request and reads it locally |
/// | `cache_limit` | bytes (`500GB`, `64GiB`) | unlimited | `500GB` | cache_dir: least recently used shards not in use by any loader are removed after a download, down to this size |
/// | `blend` | `W:SPEC,W:SPEC,…`, each SPEC `megatron:…` or `tokens:…` | none | `0.7:megatron:/data/web,0.3:tokens:/data/code-*.bin` | in place of `source`: a weighted mixture of token sources with Megatron's greedy apportioning (after k samples each dataset's count is within 1 of its weight × k); the blend has as many samples as its datasets together, and a dataset shorter than its share wraps around, each later pass in a permutation of its own (by `seed`) |
/// | `seq_len` | integer 1..=1073741824 | required for token sources | `2048` | token sources: sample `i` is the `seq_len + 1` tokens from token `i × seq_len` of the files laid end to end (`input_ids` the first `seq_len`, `labels` the last `seq_len`) |
/// | `global_batch_size` | integer ≥ 1 | `batch_size × world_size` | `512` | token sources: samples in one global step. Global batch `b` is entries `b·G..(b+1)·G` of the epoch's order whatever the world size, worker count or `batch_size`; rank `r` of `W` takes its contiguous slice `[r·G/W, (r+1)·G/W)` in micro-batches of `batch_size` (G must divide by `world_size × batch_size`); an epoch's tail shorter than `G` is not delivered; `save_state` counts whole global batches, so it resumes at any world size that divides `G` |
/// | `document_boundaries` | `ignore`, `reset` | ignore | `reset` | token sources: `reset` adds `position_ids` (0 at each document's first token in the window) and `cu_seqlens` (int32 offsets of the documents in the window, from 0 to `seq_len`; ragged: padded with `seq_len` unless `pad` says otherwise, with `cu_seqlens_lengths`) |
/// | `token_output_dtype` | `int64`, `int32` | int64 | `int32` | token sources: the type of `input_ids`, `labels` and `position_ids` (a token that does not fit int32 is an error naming its file) |
/// | `token_dtype` | `uint16`, `uint32`, `int32` | required for raw `tokens:` files | `uint16` | `tokens:` sources: the element type of raw `.bin` token files (`.npy` files say theirs) |
/// | `eos_token` | integer ≥ 0 | none | `50256` | `tokens:` sources: the end-of-document token (it ends the document it closes); without it a file is one document, unless a sidecar of document lengths `NAME.lengths.npy` lies beside it (not with `eos_token`). `parquet:` sources: appended to every document's tokens (Megatron's `--append-eod`) |
/// | `token_packing` | `concat`, `pad` | concat | `pad` | token sources: `concat` cuts the files' stream into windows (see `seq_len`); `pad` makes sample `i` document `i` (the documents of every file in order: Megatron's document index; a flat file's sidecar of lengths `NAME.lengths.npy`; a flat file without either is one document, with `eos_token` `pad` is refused, since counting them would read every token), truncated to its first `seq_len + 1` tokens or padded with `pad_token` to them, and adds `loss_mask` (uint8, `[seq_len]`: 1 where the label is a real next token of the document, 0 on padding); with `document_boundaries=reset`, `cu_seqlens` is `[0, n, seq_len]` (n the document's tokens among the inputs) and `position_ids` restart at 0 on the padding |
/// | `pad_token` | integer ≥ 0 | 0 | `50256` | token sources with `token_packing=pad`: the token id after a document's end in `input_ids` and `labels` (`loss_mask` is 0 there), checked at open to fit `token_output_dtype` and to lie below `vocab_size` when set |
/// | `allow_config_change` | bool | false | `true` | token sources: resume although the source, blend, `seq_len`, `global_batch_size` or token settings changed since the state was saved (otherwise an error naming what changed): the job continues in the saved epoch after as many of its samples as the state counts, rounded down to whole global batches and at most the epoch |
/// | `vocab_size` | integer ≥ 1 | none (not checked) | `50304` | token sources: every token id must be in `0..vocab_size`, else opening fails naming the file and the token's place; the check reads every token once (O(tokens)), so it runs only when set (for `parquet:`, the tokenizer's vocabulary, added tokens included, must fit) |
/// | `tokenizer` | a `tokenizer.json` path | required for `parquet:` sources | `tokenizer.json` | `parquet:` sources: the Hugging Face tokenizer (`tokenizer.json`, as every Hub model ships it) that turns each row's text into tokens, with its special tokens (`add_special_tokens=True`); the tokenizer's bytes are part of the resume fingerprint |
/// | `text_column` | a column name | text | `content` | `parquet:` sources: the string (or binary UTF-8) column holding each row's document; a null is an empty document |
/// <!-- options:end -->
#[no_mangle]
pub extern "C" fn stoker_options_set(
    o: *mut stoker_options,
    key: *const std::ffi::c_char,
    value: *const std::ffi::c_char,
) -> stoker_status {
    ffi_boundary!(stoker_options_set => {
        let o = try_mut!(o);
        let key = try_str!(key);
        let value = try_str!(value);
        match o.inner.set(key, value) {
            Ok(()) => stoker_status::STOKER_OK,
            Err(e) => fail(&e),
        }
    })
}

/// Makes a `device=cuda[:N]` loader copy its batches on the caller's `cuda_stream` (a `CUstream`
/// / `cudaStream_t` of that device's primary context; NULL is the legacy default stream) instead
/// of a stream of its own. The stream is borrowed, never destroyed: it must outlive the loader and
/// every batch it delivers. The same as the option `cuda_stream` set to the stream's address.
/// Loaders on the CPU ignore it.
#[no_mangle]
pub extern "C" fn stoker_options_set_cuda_stream(
    o: *mut stoker_options,
    cuda_stream: *mut std::ffi::c_void,
) -> stoker_status {
    ffi_boundary!(stoker_options_set_cuda_stream => {
        let o = try_mut!(o);
        o.inner.set_cuda_stream(cuda_stream as usize);
        stoker_status::STOKER_OK
    })
}

/// Resolves, without making a loader, the rank, world size, local rank and local world size a
/// loader made from these options would have: explicit `rank` / `world_size`, or for `auto` the
/// launcher's variables (torchrun, Slurm, Open MPI, PMI) in this process's environment.
/// Inconsistent variables give `STOKER_ERR_INVALID_ARGUMENT` naming them; `*out` is then zeroed.
#[no_mangle]
pub extern "C" fn stoker_options_launch(
    o: *const stoker_options,
    out: *mut stoker_launch,
) -> stoker_status {
    ffi_boundary!(stoker_options_launch => {
        non_null!(out);
        // SAFETY: `out` is non-NULL and writable for one `stoker_launch` by the C contract.
        unsafe { out.write(stoker_launch::default()) };
        let o = try_ref!(o);
        match o.inner.launch() {
            Ok(l) => {
                let launch = stoker_launch {
                    rank: l.rank as u64,
                    world_size: l.world_size as u64,
                    local_rank: l.local_rank as u64,
                    local_world_size: l.local_world_size as u64,
                    launcher: l.launcher.code(),
                };
                // SAFETY: as above.
                unsafe { out.write(launch) };
                stoker_status::STOKER_OK
            }
            Err(e) => fail(&e),
        }
    })
}

/// Frees options; NULL is a no-op. Loaders made from them are not affected.
#[no_mangle]
pub extern "C" fn stoker_options_free(o: *mut stoker_options) {
    ffi_boundary!(stoker_options_free => {
        // SAFETY: by the C contract `o` is NULL or came from `stoker_options_new` and is freed once.
        unsafe { free_raw(o) }
    })
}
