"""image_folder batches against Pillow's decode of the same files.

These need a library built with the image pipeline; one without it says so with
UnsupportedError, and then the tests skip with that reason.
"""

import shutil
from pathlib import Path

import numpy as np
import pytest
from _optional import import_torch
from PIL import Image

import stoker

W, H = 40, 30
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float64)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float64)
# stoker batches only fixed-size outputs; a resize to the files' own size is the identity.
SAME_SIZE = f"resize({H}, {W})"


def smooth_image(rng):
    """A photo-like image (smooth gradients plus a little noise), so JPEG stays near lossless."""
    y, x = np.mgrid[0:H, 0:W]
    channels = [np.sin(x / rng.uniform(3, 9) + rng.uniform(0, 6)) + np.cos(y / rng.uniform(3, 9))]
    channels += [x / W + rng.uniform(-0.2, 0.2), y / H * rng.uniform(0.5, 1)]
    rgb = np.stack(channels, -1)
    rgb = (rgb - rgb.min()) / (np.ptp(rgb) + 1e-9) * 230 + rng.uniform(0, 12, rgb.shape)
    return Image.fromarray(rgb.astype(np.uint8), "RGB")


def make_folder(root, ext, **save):
    """ROOT/{cat,dog}/img_k.<ext>: three images per class; returns the files in label order."""
    rng = np.random.default_rng(3)
    files = []
    for cls in ("cat", "dog"):
        (root / cls).mkdir(parents=True)
        for k in range(3):
            path = root / cls / f"img_{k}.{ext}"
            smooth_image(rng).save(path, **save)
            files.append(path)
    return files


def pillow_rgb(path):
    return np.asarray(Image.open(path).convert("RGB"))


@pytest.fixture
def png_folder(tmp_path):
    files = make_folder(tmp_path / "png", "png")
    try:
        stoker.Loader(f"image_folder:{tmp_path / 'png'}", transform=SAME_SIZE).close()
    except stoker.UnsupportedError as e:
        pytest.skip(f"library without the image pipeline: {e}")
    return tmp_path / "png", files


def one_batch(root, **options):
    with stoker.Loader(f"image_folder:{root}", batch_size=6, **options) as loader:
        return next(iter(loader))


def test_png_decode_equals_pillow_and_labels_follow_sorted_classes(png_folder):
    root, files = png_folder
    batch = one_batch(root, transform=SAME_SIZE)
    assert list(batch) == ["image", "label"]
    image = batch["image"]
    assert image.dtype == np.uint8 and image.shape == (6, 3, H, W)
    for i, path in enumerate(files):
        np.testing.assert_array_equal(image[i], pillow_rgb(path).transpose(2, 0, 1))
    np.testing.assert_array_equal(batch["label"], [0, 0, 0, 1, 1, 1])


def test_jpeg_decode_close_to_pillow(png_folder, tmp_path):
    files = make_folder(tmp_path / "jpeg", "JPEG", quality=95)
    image = one_batch(tmp_path / "jpeg", transform=SAME_SIZE, layout="nhwc")["image"]
    assert image.shape == (6, H, W, 3)
    for i, path in enumerate(files):
        diff = np.abs(image[i].astype(int) - pillow_rgb(path).astype(int))
        assert diff.mean() <= 1.0 and diff.max() <= 8, (path, diff.mean(), diff.max())


def test_center_crop_and_normalize_equal_numpy(png_folder):
    root, files = png_folder
    image = one_batch(root, transform="center_crop(16) | normalize(imagenet)")["image"]
    assert image.dtype == np.float32 and image.shape == (6, 3, 16, 16)
    top, left = round((H - 16) / 2), round((W - 16) / 2)
    for i, path in enumerate(files):
        crop = pillow_rgb(path)[top : top + 16, left : left + 16] / 255.0
        want = ((crop - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)
        np.testing.assert_allclose(image[i], want, atol=1e-5)


def test_resize_close_to_pillow_bilinear(png_folder):
    root, files = png_folder
    image = one_batch(root, transform="resize(15, 20)")["image"]
    assert image.shape == (6, 3, 15, 20)
    for i, path in enumerate(files):
        want = np.asarray(Image.open(path).convert("RGB").resize((20, 15), Image.BILINEAR))
        diff = np.abs(image[i].transpose(1, 2, 0).astype(int) - want.astype(int))
        assert diff.mean() <= 1.0 and diff.max() <= 4, (path, diff.mean(), diff.max())


def bfloat16_bits_to_float32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_outputs(png_folder, dtype):
    root, _ = png_folder
    spec = "center_crop(16) | normalize(imagenet)"
    reference = one_batch(root, transform=spec)["image"]
    batch = one_batch(root, transform=spec, dtype=dtype)
    image = batch["image"]
    assert batch.dtype("image") == dtype
    if dtype == "float16":
        assert image.dtype == np.float16
        np.testing.assert_allclose(image.astype(np.float32), reference, rtol=2**-10, atol=1e-3)
    else:  # NumPy has no bfloat16: the raw bits, as uint16
        assert image.dtype == np.uint16
        values = bfloat16_bits_to_float32(image)
        np.testing.assert_allclose(values, reference, rtol=2**-7, atol=1e-2)


def test_bfloat16_is_a_real_bfloat16_tensor_in_torch(png_folder):
    torch = import_torch()
    root, _ = png_folder
    batch = one_batch(root, transform=f"{SAME_SIZE} | normalize(imagenet)", dtype="bfloat16")
    tensor = batch.torch()["image"]
    assert tensor.dtype == torch.bfloat16
    assert tensor.data_ptr() == batch["image"].ctypes.data
    np.testing.assert_array_equal(tensor.float().numpy(), bfloat16_bits_to_float32(batch["image"]))


def test_random_resized_crop_and_flip_are_a_function_of_seed_and_epoch(png_folder):
    root, _ = png_folder
    spec = "random_resized_crop(24) | hflip | normalize(imagenet)"

    def two_epochs(seed):
        with stoker.Loader(f"image_folder:{root}", batch_size=6, transform=spec, seed=seed) as lo:
            return [b["image"].copy() for _ in range(2) for b in lo]

    a = two_epochs(1)
    assert a[0].shape == (6, 3, 24, 24) and a[0].dtype == np.float32
    np.testing.assert_array_equal(a[0], two_epochs(1)[0])
    assert not np.array_equal(a[0], a[1]), "new augmentation every epoch"
    assert not np.array_equal(a[0], two_epochs(2)[0])


def test_corrupt_file_is_a_decode_error_naming_it(png_folder):
    root, files = png_folder
    files[1].write_bytes(files[1].read_bytes()[:100])
    with pytest.raises(stoker.DecodeError, match="img_1.png"):
        one_batch(root, transform=SAME_SIZE)


PHOTOS = Path(__file__).resolve().parents[3] / "crates" / "stoker-core" / "tests" / "data" / "images"
# Real camera photos (500x375): 4:2:0 baseline, progressive, grayscale, 4:4:4 and CMYK.
PHOTO_NAMES = ["photo_444.jpg", "photo_baseline.jpg", "photo_cmyk.jpg", "photo_gray.jpg", "photo_progressive.jpg"]


def torchvision_resize_then_center_crop(img, size, crop):
    """Pillow's bilinear resize of the shorter side to `size`, then torchvision's center crop."""
    w, h = img.size
    new = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
    img = img.resize(new, Image.BILINEAR)
    if crop is None:
        return np.asarray(img)
    top, left = round((new[1] - crop) / 2), round((new[0] - crop) / 2)
    return np.asarray(img)[top : top + crop, left : left + crop]


@pytest.mark.parametrize("decoder", ["turbo", "zune"])
@pytest.mark.parametrize(
    "spec, size, crop",
    [
        # 375 -> 56: more than 6 times smaller, so libjpeg-turbo shrinks 1/2 in the DCT domain
        # and the resample shrinks the rest (3.3x).
        ("resize(56, 74)", 56, None),
        # A crop of the middle: only its rows and columns are decoded.
        ("resize(256) | center_crop(160)", 256, 160),
    ],
)
def test_crop_aware_decode_agrees_with_pillow_crop_and_resize(tmp_path, decoder, spec, size, crop):
    """Decoding only what the crop reads keeps today's tolerance against Pillow decoding the
    whole file and resizing it: mean absolute difference <= 1 level, at most 8 levels."""
    (tmp_path / "photos" / "a").mkdir(parents=True)
    for name in PHOTO_NAMES:
        shutil.copy(PHOTOS / name, tmp_path / "photos" / "a" / name)
    options = dict(batch_size=len(PHOTO_NAMES), transform=spec, layout="nhwc", jpeg_decoder=decoder, num_workers=0)
    with stoker.Loader(f"image_folder:{tmp_path / 'photos'}", **options) as loader:
        image = next(iter(loader))["image"]
        stats = loader.stats()
    for i, name in enumerate(PHOTO_NAMES):
        want = torchvision_resize_then_center_crop(Image.open(PHOTOS / name).convert("RGB"), size, crop)
        assert image[i].shape == want.shape
        diff = np.abs(image[i].astype(int) - want.astype(int))
        assert diff.mean() <= 1.0 and diff.max() <= 8, (name, decoder, diff.mean(), diff.max())
    # The decoder is chosen per image, and each choice is counted.
    decoded = (stats.decoded_zune, stats.decoded_turbo, stats.decoded_turbo_region, stats.decoded_turbo_scaled)
    if decoder == "zune":
        assert decoded == (5, 0, 0, 0)
    elif crop is None:
        # CMYK goes to zune-jpeg; the other four are shrunk regions (the whole frame here).
        assert decoded == (1, 0, 4, 4), decoded
    else:
        assert decoded == (1, 0, 4, 0), decoded


def test_an_unknown_jpeg_decoder_is_an_option_error(tmp_path):
    with pytest.raises(stoker.InvalidArgumentError, match="jpeg_decoder"):
        stoker.Loader(f"image_folder:{tmp_path}", jpeg_decoder="pillow")


def damaged_scan_jpeg(good):
    """`good` (a baseline JPEG) with the code counts of its first Huffman table all 0xFF: a
    valid start, a table no decoder can build. libjpeg-turbo's header parser used to keep this
    file's state and fail every later image on the same worker."""
    i = 2
    while good[i + 1] != 0xC4:  # walk the marker segments to the first DHT
        i += 2 + int.from_bytes(good[i + 2 : i + 4], "big")
    return good[: i + 5] + b"\xff" * 16 + good[i + 21 :]


@pytest.fixture
def dirty_folder(tmp_path):
    """The kind of folder a web crawl gives: 8 good photos (one a PNG named .JPEG), an empty file,
    HTML saved as a JPEG, a truncated JPEG and one with a damaged Huffman table, sorted so that
    the bad files sit between good ones. Returns (root, names of the bad files)."""
    root = tmp_path / "crawl"
    (root / "a").mkdir(parents=True)
    good = (PHOTOS / "photo_baseline.jpg").read_bytes()
    files = {f"{i:02d}.JPEG": (PHOTOS / name).read_bytes() for i, name in enumerate(PHOTO_NAMES * 2)}
    files["03.JPEG"] = (PHOTOS / "photo_png_named.JPEG").read_bytes()
    bad = {
        "04.JPEG": b"",
        "06.JPEG": b"<html><body>403 Forbidden</body></html>",
        "08.JPEG": good[: len(good) // 2],
        "09.JPEG": damaged_scan_jpeg(good),
    }
    files.update(bad)
    for name, data in files.items():
        (root / "a" / name).write_bytes(data)
    return root, sorted(bad)


@pytest.mark.parametrize("decoder", ["turbo", "zune"])
def test_bad_files_affect_only_their_own_samples(dirty_folder, decoder):
    root, bad = dirty_folder
    options = dict(batch_size=1, num_workers=1, transform="random_resized_crop(64)", jpeg_decoder=decoder)
    with stoker.Loader(f"image_folder:{root}", on_error="skip", **options) as loader:
        delivered = sum(len(b["label"]) for b in loader)
        # A replacement is drawn from the whole folder, so it may be a bad file too (counted).
        assert delivered == 10 and loader.stats().samples_skipped >= len(bad)

    with stoker.Loader(f"image_folder:{root}", on_error="raise", **options) as loader:
        for _ in range(2):  # the second epoch decodes every good file again
            failed = []
            for i in range(10):
                try:
                    assert loader.next_batch() is not None
                except stoker.DecodeError as e:
                    failed.append(str(e))
            assert len(failed) == len(bad), failed
            for message, name in zip(failed, bad):
                assert name in message
            assert loader.next_batch() is None


@pytest.mark.parametrize("dtype,layout", [("float32", "nchw"), ("bfloat16", "nhwc")])
def test_gpu_normalize_device_batches_equal_the_cpu_batches_bit_for_bit(png_folder, dtype, layout):
    """device="cuda": images cross as uint8 and the cast kernel makes the float output on the
    device with the CPU path's table, so the tensors torch sees are the CPU's, bit for bit."""
    torch = import_torch()
    if not torch.cuda.is_available():
        pytest.skip("SKIPPED, needs a GPU: no CUDA device here to run the gpu_normalize kernel")
    root, _ = png_folder
    spec = "random_resized_crop(24) | hflip | normalize(imagenet)"
    options = dict(batch_size=6, transform=spec, dtype=dtype, layout=layout, seed=9)
    with stoker.Loader(f"image_folder:{root}", **options) as cpu, \
            stoker.Loader(f"image_folder:{root}", device="cuda", **options) as gpu:
        for host, device in zip(cpu, gpu):
            on_gpu = device.torch()["image"]
            assert on_gpu.is_cuda and on_gpu.dtype == host.torch()["image"].dtype
            torch.cuda.synchronize()
            same = on_gpu.cpu().view(torch.int16 if dtype == "bfloat16" else torch.int32)
            want = host.torch()["image"].view(same.dtype)
            assert torch.equal(same, want)
        assert gpu.stats().device_memory_bytes > 0


def test_gpu_decode_batches_agree_with_the_cpu_within_a_few_levels(tmp_path):
    """jpeg_decoder="gpu": the prefetch thread decodes the JPEGs with nvJPEG and crops, resizes
    and flips them on the device with the draws the CPU path uses; what differs is the decoder's
    IDCT and the resampler's rounding, a few levels. Progressive files are decoded by the
    workers."""
    torch = import_torch()
    if not torch.cuda.is_available():
        pytest.skip("SKIPPED, needs a GPU: no CUDA device here to decode JPEGs with nvJPEG")
    root = tmp_path / "jpg"
    make_folder(root, "jpg", quality=95)
    for path in list((root / "dog").iterdir())[:1]:
        Image.open(path).save(path, quality=95, progressive=True)
    spec = "random_resized_crop(32) | hflip"
    options = dict(batch_size=6, transform=spec, dtype="uint8", seed=4)
    with stoker.Loader(f"image_folder:{root}", **options) as cpu, \
            stoker.Loader(f"image_folder:{root}", device="cuda", jpeg_decoder="gpu", **options) as gpu:
        for host, device in zip(cpu, gpu):
            on_gpu = device.torch()["image"]
            assert on_gpu.is_cuda
            torch.cuda.synchronize()
            diff = (on_gpu.cpu().int() - host.torch()["image"].int()).abs()
            assert diff.max() <= 64 and diff.float().mean() <= 2.0, (diff.max(), diff.float().mean())
        stats = gpu.stats()
        assert stats.decoded_device >= 5 and stats.gpu_decode_share == 1.0
