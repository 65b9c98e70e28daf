"""The augmentations against torchvision v2: stoker's output for one draw equals torchvision's
functional op applied with the parameters stoker drew (exposed by ``stoker.transform_image``), to
the same decoded uint8 image, within the tolerance stated per op; and the drawn parameters follow
torchvision's distributions.

Tolerances (uint8 levels): flips, crops with padding, grayscale, erasing, posterize, solarize,
invert, equalize: exact. Colour ops (float32 arithmetic, truncated): at most 1 level each, so
colour jitter's four in a row at most 2, on a few values.
Gaussian blur (separable here, 2-D in torchvision): at most 1. Bilinear rotate/affine: at most 2.
Nearest-neighbour warps of the AutoAugment family: a pixel whose source coordinate lies on a
rounding boundary may pick the neighbour, so 99% of values within 2 levels.
"""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest

import stoker

torch = pytest.importorskip("torch")
tv2 = pytest.importorskip("torchvision.transforms.v2")
F = tv2.functional
from torchvision.transforms import InterpolationMode  # noqa: E402

H, W = 48, 64
CROP = f"center_crop({H}, {W})"


def photo() -> np.ndarray:
    """A smooth colour image with texture and saturated corners (exercises clamping, hue
    sectors and edges)."""
    rng = np.random.default_rng(3)
    y, x = np.mgrid[0:H, 0:W].astype(np.float64)
    r = 128 + 120 * np.sin(x / 7.0)
    g = 128 + 120 * np.cos(y / 5.0)
    b = 255 * (x + y) / (H + W)
    img = np.stack([r, g, b], axis=-1) + rng.normal(0, 12, (H, W, 3))
    img[:6, :6] = 255
    img[-6:, -6:] = 0
    return np.clip(img, 0, 255).astype(np.uint8)


def chw(img: np.ndarray) -> "torch.Tensor":
    return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).contiguous()


def hwc(t: "torch.Tensor") -> np.ndarray:
    return t.permute(1, 2, 0).contiguous().numpy()


def run(spec: str, index: int, shape=(H, W)):
    out, params = stoker.transform_image(spec, photo(), shape, seed=11, index=index)
    return out, [p for p in params if p["op"] != "plan"]


def max_diff(a: np.ndarray, b: np.ndarray) -> int:
    assert a.shape == b.shape
    return int(np.abs(a.astype(np.int32) - b.astype(np.int32)).max())


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric"])
def test_random_crop_with_padding_matches(mode):
    for index in range(8):
        out, [p] = run(f"{CROP} | random_crop(40, padding=4, pad_mode={mode}, fill=7)", index, (40, 40))
        padded = F.pad(chw(photo()), [4, 4, 4, 4], fill=7, padding_mode=mode)
        ref = F.crop(padded, p["top"], p["left"], 40, 40)
        assert max_diff(out, hwc(ref)) == 0, (mode, p)


def test_flips_and_grayscale_match():
    img = chw(photo())
    out, _ = run(f"{CROP} | vflip(p=1)", 0)
    assert max_diff(out, hwc(F.vertical_flip(img))) == 0
    out, _ = run(f"{CROP} | grayscale(p=1)", 0)
    assert max_diff(out, hwc(F.rgb_to_grayscale(img, num_output_channels=3))) == 0
    out, _ = run(f"{CROP} | hflip(p=1) | vflip(p=1)", 0)
    assert max_diff(out, hwc(F.vertical_flip(F.horizontal_flip(img)))) == 0


def test_color_jitter_matches():
    fns = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]
    for index in range(24):
        out, [p] = run(f"{CROP} | color_jitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)", index)
        ref = chw(photo())
        for i in p["order"]:
            key = ["brightness", "contrast", "saturation", "hue"][i]
            ref = fns[i](ref, p[key])
        # Each adjustment is within 1 level, so four in a row may differ by 2, rarely (one
        # value of 9,216 in 3 draws of 200).
        diff = np.abs(out.astype(np.int32) - hwc(ref).astype(np.int32))
        assert diff.max() <= 2 and (diff > 1).sum() <= 2, p


def test_random_photometric_distort_matches():
    seen = collections.Counter()
    for index in range(24):
        out, [p] = run(f"{CROP} | random_photometric_distort(p=0.5)", index)
        ref = chw(photo())
        # RandomPhotometricDistort.transform's order, with the parameters stoker drew.
        if p["brightness"] is not None:
            ref = F.adjust_brightness(ref, p["brightness"])
        if p["contrast"] is not None and p["contrast_before"]:
            ref = F.adjust_contrast(ref, p["contrast"])
        if p["saturation"] is not None:
            ref = F.adjust_saturation(ref, p["saturation"])
        if p["hue"] is not None:
            ref = F.adjust_hue(ref, p["hue"])
        if p["contrast"] is not None and not p["contrast_before"]:
            ref = F.adjust_contrast(ref, p["contrast"])
        if p["permutation"] is not None:
            ref = F.permute_channels(ref, p["permutation"])
        assert max_diff(out, hwc(ref)) <= 1, p
        seen["permuted"] += p["permutation"] is not None
        seen["before"] += p["contrast_before"]
        seen["skipped"] += sum(p[k] is None for k in ("brightness", "contrast", "saturation", "hue"))
    assert 0 < seen["permuted"] < 24 and 0 < seen["before"] < 24 and 0 < seen["skipped"] < 96, seen


def test_gaussian_blur_matches():
    for index in range(6):
        out, [p] = run(f"{CROP} | gaussian_blur(5, sigma=0.1:2.0)", index)
        ref = F.gaussian_blur(chw(photo()), [5, 5], [p["sigma"], p["sigma"]])
        assert max_diff(out, hwc(ref)) <= 1, p


def test_rotate_and_affine_match():
    for index in range(6):
        out, [p] = run(f"{CROP} | rotate(30, fill=10,20,30)", index)
        ref = F.rotate(chw(photo()), p["angle"], interpolation=InterpolationMode.BILINEAR, fill=[10, 20, 30])
        assert max_diff(out, hwc(ref)) <= 2, p
        out, [p] = run(f"{CROP} | affine(degrees=15, translate=0.1:0.1, scale=0.8:1.2, shear=10)", index)
        ref = F.affine(
            chw(photo()),
            angle=p["angle"],
            translate=[int(t) for t in p["translate"]],
            scale=p["scale"],
            shear=p["shear"],
            interpolation=InterpolationMode.BILINEAR,
            fill=[0, 0, 0],
        )
        assert max_diff(out, hwc(ref)) <= 2, p


def replay_policy(params, policy) -> np.ndarray:
    ref = chw(photo())
    for p in params:
        if p.get("skipped"):
            continue
        ref = policy._apply_image_or_video_transform(
            ref, p["name"], p["magnitude"], interpolation=InterpolationMode.NEAREST, fill=policy._fill
        )
    return hwc(ref)


@pytest.mark.parametrize(
    "spec,policy",
    [
        ("trivial_augment", lambda: tv2.TrivialAugmentWide()),
        ("rand_augment(num_ops=2, magnitude=9)", lambda: tv2.RandAugment(num_ops=2, magnitude=9)),
        ("auto_augment(imagenet)", lambda: tv2.AutoAugment()),
    ],
)
def test_augment_policies_match(spec, policy):
    policy = policy()
    seen = set()
    for index in range(60):
        out, params = run(f"{CROP} | {spec}", index)
        ref = replay_policy(params, policy)
        close = np.abs(out.astype(int) - ref.astype(int)) <= 2
        seen.update(p["name"] for p in params)
        assert close.mean() >= 0.99, (params, close.mean())
        if not any(p["name"] in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate") for p in params):
            # Colour ops alone: at most 1 level everywhere.
            assert max_diff(out, ref) <= 1, params
    assert len(seen) >= 8, seen


def test_random_erasing_matches():
    applied = 0
    for index in range(16):
        out, [p] = run(f"{CROP} | random_erasing(p=0.7, value=100)", index)
        ref = chw(photo())
        if p["apply"]:
            applied += 1
            ref = F.erase(ref, p["top"], p["left"], p["height"], p["width"], torch.tensor(100, dtype=torch.uint8))
        assert max_diff(out, hwc(ref)) == 0, p
    assert 0 < applied < 16


def test_erasing_after_normalize_writes_the_value_in_normalized_units(tmp_path):
    """random_erasing runs on the final tensor (after normalize), as torchvision's recipes put it:
    value=0 is the channel mean, not black."""
    from PIL import Image

    root = tmp_path / "imgs" / "cls"
    root.mkdir(parents=True)
    Image.fromarray(photo()).save(root / "a.png")
    loader = stoker.Loader(
        f"image_folder:{tmp_path / 'imgs'}",
        batch_size=1,
        transform=f"{CROP} | random_erasing(p=1, scale=0.2:0.3, value=0) | normalize(imagenet)",
    )
    batch = next(iter(loader))
    x = np.asarray(batch["image"])[0]
    assert x.dtype == np.float32 and x.shape == (3, H, W)
    zeros = (x == 0.0).all(axis=0)
    area = zeros.sum() / (H * W)
    assert 0.15 <= area <= 0.35, area


def test_erasing_with_value_random_writes_normal_noise(tmp_path):
    """value=random (torchvision's value="random", timm's mode="pixel") fills the box with
    standard normal noise, one draw per element, the same for the same draw."""
    from PIL import Image

    root = tmp_path / "imgs" / "cls"
    root.mkdir(parents=True)
    for i in range(8):
        Image.fromarray(np.roll(photo(), i, axis=1)).save(root / f"{i}.png")

    def images(value: str) -> np.ndarray:
        loader = stoker.Loader(
            f"image_folder:{tmp_path / 'imgs'}",
            batch_size=8,
            seed=4,
            transform=f"{CROP} | random_erasing(p=1, scale=0.2:0.3, value={value}) | normalize(imagenet)",
        )
        return np.concatenate([np.asarray(b["image"]) for b in loader])

    box = images("1000") == 1000.0  # the same draws place the box; a constant marks it
    noise = images("random")
    assert np.array_equal(noise, images("random"))
    z = noise[box].astype(np.float64)
    assert box.all(axis=1).sum() >= 0.19 * 8 * H * W  # every channel of each box pixel
    assert abs(z.mean()) < 0.06 and abs(z.var() - 1.0) < 0.08, (z.mean(), z.var())
    assert np.abs(noise[~box]).max() < 3.0  # normalized pixels outside


def test_parameters_follow_torchvision_distributions():
    n = 1500
    spec = (
        f"{CROP} | random_crop(40, padding=4) | rotate(30) | color_jitter(brightness=0.4, hue=0.1) "
        f"| trivial_augment | random_erasing(p=0.25)"
    )
    tops, angles, bright, hues, orders, names, erased = [], [], [], [], collections.Counter(), collections.Counter(), 0
    img = photo()
    for index in range(n):
        _, params = stoker.transform_image(spec, img, (40, 40), seed=5, epoch=1, index=index)
        by = {p["op"]: p for p in params}
        tops.append(by["random_crop"]["top"])
        angles.append(by["rotate"]["angle"])
        bright.append(by["color_jitter"]["brightness"])
        hues.append(by["color_jitter"]["hue"])
        assert by["color_jitter"]["contrast"] is None
        orders[tuple(by["color_jitter"]["order"])] += 1
        names[by["trivial_augment"]["name"]] += 1
        erased += by["random_erasing"]["apply"]
    # random_crop: top uniform over 0..=(48 + 8 - 40).
    counts = np.bincount(tops, minlength=17)
    assert len(counts) == 17 and counts.min() > n / 17 * 0.5
    assert abs(np.mean(angles)) < 2.0 and -30 <= min(angles) and max(angles) <= 30
    assert abs(np.std(angles) - 60 / math.sqrt(12)) < 1.5
    assert 0.6 <= min(bright) and max(bright) <= 1.4 and abs(np.mean(bright) - 1.0) < 0.03
    assert -0.1 <= min(hues) and max(hues) <= 0.1
    assert len(orders) == 24  # every permutation of the four jitter ops occurs
    assert len(names) == 14 and min(names.values()) > n / 14 * 0.6
    assert abs(erased / n - 0.25) < 0.04


def test_draws_are_deterministic_and_keyed():
    spec = f"{CROP} | trivial_augment | color_jitter(brightness=0.5) | random_erasing(p=0.5)"
    a = stoker.transform_image(spec, photo(), (H, W), seed=1, epoch=2, index=3)
    b = stoker.transform_image(spec, photo(), (H, W), seed=1, epoch=2, index=3)
    assert np.array_equal(a[0], b[0]) and a[1] == b[1]
    others = [stoker.transform_image(spec, photo(), (H, W), seed=1, epoch=2, index=i)[1] for i in range(4, 12)]
    assert any(o != a[1] for o in others)


@pytest.mark.parametrize(
    "spec,words",
    [
        ("center_crop(8) | sharpen", ["sharpen", "unknown operation"]),
        ("center_crop(8) | rand_augment(magnitude=31)", ["rand_augment", "magnitude"]),
        ("center_crop(8) | random_crop(8, pad_mode=wrap)", ["random_crop", "pad_mode"]),
        ("color_jitter(brightness=0.4) | center_crop(8)", ["color_jitter", "fixed size"]),
        ("center_crop(8) | gaussian_blur(4)", ["gaussian_blur", "odd"]),
        ("center_crop(8) | random_erasing | hflip", ["hflip", "random_erasing"]),
        ("center_crop(8) | color_jitter(hue=0.7)", ["color_jitter", "hue"]),
    ],
)
def test_bad_specs_name_the_op_and_parameter(tmp_path, npy_data, spec, words):
    from PIL import Image

    root = tmp_path / "imgs" / "cls"
    root.mkdir(parents=True)
    Image.fromarray(photo()).save(root / "a.png")
    with pytest.raises(stoker.InvalidArgumentError) as e:
        stoker.Loader(f"image_folder:{tmp_path / 'imgs'}", batch_size=1, transform=spec)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def photo_folder(tmp_path, n=6):
    """An image_folder of `n` distinct photos in 3 classes."""
    from PIL import Image

    root = tmp_path / "mixfolder"
    for i in range(n):
        d = root / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.roll(photo(), 7 * i, axis=1)).save(d / f"{i}.png")
    return root


def first_batch(root, transform, workers=1):
    loader = stoker.Loader(
        f"image_folder:{root}", batch_size=6, seed=4, num_workers=workers, transform=transform, dtype="float32"
    )
    b = next(iter(loader))
    return np.array(b["image"]), np.array(b["label"])


@pytest.mark.parametrize("op", ["mixup(alpha=0.8, num_classes=3)", "cutmix(alpha=1.0, num_classes=3)"])
def test_mixup_and_cutmix_make_soft_labels_and_mix_the_reversed_batch(tmp_path, op):
    root = photo_folder(tmp_path)
    base = f"{CROP} | color_jitter(brightness=0.3)"
    plain, labels = first_batch(root, base)
    mixed, soft = first_batch(root, f"{base} | {op}")
    again, soft2 = first_batch(root, f"{base} | {op}", workers=3)
    assert soft.dtype == np.float32 and soft.shape == (6, 3)
    assert np.array_equal(mixed, again) and np.array_equal(soft, soft2)  # any worker count
    np.testing.assert_allclose(soft.sum(axis=1), 1.0, rtol=1e-6)
    lam = soft[0, labels[0]] if labels[0] != labels[5] else None
    partner = plain[::-1]
    if op.startswith("mixup"):
        # x'_i = lam x_i + (1 - lam) x_{B-1-i}; lam read back from the soft label.
        for i in range(6):
            if labels[i] == labels[5 - i]:
                continue
            lam = soft[i, labels[i]]
            np.testing.assert_allclose(mixed[i], lam * plain[i] + (1 - lam) * partner[i], atol=1e-5)
    else:
        for i in range(6):
            from_partner = np.isclose(mixed[i], partner[i]) & ~np.isclose(plain[i], partner[i])
            from_self = np.isclose(mixed[i], plain[i])
            assert (from_partner | from_self).all()
            if labels[i] != labels[5 - i]:
                # The pasted box's share of the area is 1 - lam (timm's corrected lam).
                area = from_partner.any(axis=0).mean()
                assert abs(area - (1 - soft[i, labels[i]])) < 0.05
    assert lam is None or 0.0 <= lam <= 1.0


def test_mix_errors_name_the_op(tmp_path):
    root = photo_folder(tmp_path)
    with pytest.raises(stoker.InvalidArgumentError, match="num_classes"):
        stoker.Loader(f"image_folder:{root}", batch_size=2, transform=f"{CROP} | mixup(alpha=0.2)")
    with pytest.raises(stoker.InvalidArgumentError, match="cutmix.*alpha"):
        stoker.Loader(f"image_folder:{root}", batch_size=2, transform=f"{CROP} | cutmix(alpha=-1, num_classes=3)")
    # A label outside num_classes is a sample error naming the label.
    loader = stoker.Loader(f"image_folder:{root}", batch_size=6, transform=f"{CROP} | mixup(num_classes=2)")
    with pytest.raises(stoker.StokerError, match="label 2 is outside 0..2"):
        next(iter(loader))


def test_uint8_image_tensors_from_npy_are_transformed(make_loader, npy_data):
    """An npy of uint8 [N, 3, 8, 8] images (chw, from the shape) goes through the transform like
    decoded images; a [N, 8, 8, 3] one with input_layout=hwc too."""
    _, _, data, _ = npy_data
    spec = "center_crop(8) | vflip(p=1) | normalize(mean=0.5, std=0.25)"
    loader = make_loader(transform=spec, batch_size=103)
    batch = next(iter(loader))
    x = np.asarray(batch["data"])
    assert x.dtype == np.float32 and x.shape == (103, 3, 8, 8)
    expected = (data[:, :, ::-1, :].astype(np.float64) / 255 - 0.5) / 0.25
    np.testing.assert_allclose(x, expected, atol=1e-5)

    hwc_path = npy_data[0].parent / "hwc.npy"
    np.save(hwc_path, np.ascontiguousarray(data.transpose(0, 2, 3, 1)))
    loader = stoker.Loader(
        f"npy:{hwc_path}", batch_size=103, input_layout="hwc", layout="nhwc", transform="center_crop(8) | hflip(p=1)"
    )
    y = np.asarray(next(iter(loader))["data"])
    assert y.dtype == np.uint8 and y.shape == (103, 8, 8, 3)
    assert np.array_equal(y, data.transpose(0, 2, 3, 1)[:, :, ::-1, :])


def test_dtype_or_layout_alone_converts_uint8_image_tensors(tmp_path):
    """No transform needed: the tensors' size is known, so dtype converts (x / 255) and layout
    transposes on their own, and ops such as color_jitter may come first."""
    data = np.random.default_rng(3).integers(0, 256, (10, 3, 6, 7), dtype=np.uint8)
    path = tmp_path / "chw.npy"
    np.save(path, data)
    x = np.asarray(next(iter(stoker.Loader(f"npy:{path}", batch_size=10, dtype="float32")))["data"])
    assert x.dtype == np.float32 and x.shape == (10, 3, 6, 7)
    np.testing.assert_array_equal(x, (data / 255.0).astype(np.float32))
    y = np.asarray(next(iter(stoker.Loader(f"npy:{path}", batch_size=10, layout="nhwc")))["data"])
    assert y.dtype == np.uint8 and np.array_equal(y, data.transpose(0, 2, 3, 1))
    z = np.asarray(
        next(iter(stoker.Loader(f"npy:{path}", batch_size=10, transform="color_jitter(brightness=0.5) | hflip")))[
            "data"
        ]
    )
    assert z.shape == (10, 3, 6, 7)
    with pytest.raises(stoker.InvalidArgumentError, match=r"field `data` \(7x6\).*center_crop"):
        stoker.Loader(f"npy:{path}", batch_size=10, transform="center_crop(8)")


def test_transform_on_a_tensor_source_without_images_is_an_error(tmp_path):
    path = tmp_path / "f.npy"
    np.save(path, np.zeros((4, 5), dtype=np.float32))
    with pytest.raises(stoker.InvalidArgumentError, match="transform.*uint8 tensor"):
        stoker.Loader(f"npy:{path}", batch_size=2, transform="center_crop(4)")


def test_uint8_image_tensors_from_a_python_dataset_are_transformed():
    """Callback sources too: HWC uint8 arrays from __getitem__ go through the transform."""

    class Images:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3) + i, i

    loader = stoker.Loader(Images(), batch_size=4, transform="center_crop(6) | vflip(p=1) | normalize(mean=0, std=1)")
    batch = next(iter(loader))
    names = [n for n in batch.keys() if n != "label"]
    x = np.asarray(batch[names[0]])
    assert x.shape == (4, 3, 6, 6) and x.dtype == np.float32
    src = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)[1:7, 1:7][::-1].transpose(2, 0, 1)
    np.testing.assert_allclose(x[0], src / 255.0, atol=1e-6)
