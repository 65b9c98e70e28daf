"""Dense tensors against torchvision v2: a 13-channel float32 (and uint16) image and its
segmentation mask (``fields(image=..., mask=...)``) through one draw. The mask's labels encode
their source pixel (``y * W + x``), so the crop and flip stoker drew can be read back from the
delivered mask; the image and the mask must then equal torchvision's ``resized_crop`` +
``hflip`` of the same box: the image with antialiased bilinear resampling in float (within
float32 rounding; uint16 against a float copy, rounded once), the mask with
``InterpolationMode.NEAREST`` (exactly, as a ``tv_tensors.Mask``), and bounding boxes as
``tv_tensors.BoundingBoxes`` through the same ops, then ``ClampBoundingBoxes`` and
``SanitizeBoundingBoxes`` (their labels dropped with them).
"""

from __future__ import annotations

import numpy as np
import pytest

import stoker

torch = pytest.importorskip("torch")
tv2 = pytest.importorskip("torchvision.transforms.v2")
tv_tensors = pytest.importorskip("torchvision.tv_tensors")
F = tv2.functional
from torchvision.transforms import InterpolationMode  # noqa: E402

N, C, S, OUT = 12, 13, 64, 32


def bands(i: int) -> np.ndarray:
    """A smooth, textured 13-band float32 image in [0, 1], channels first."""
    y, x = np.mgrid[0:S, 0:S].astype(np.float64)
    rng = np.random.default_rng(i)
    planes = [
        0.5 + 0.4 * np.sin(x / (3 + c) + i) * np.cos(y / (4 + c % 5)) + rng.normal(0, 0.03, (S, S))
        for c in range(C)
    ]
    return np.stack(planes).astype(np.float32)


COORDS = (np.arange(S)[:, None] * S + np.arange(S)[None, :]).astype(np.int64)


class Scenes:
    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"image": bands(i), "mask": COORDS}


SPEC = f"fields(image=image, mask=mask) | random_resized_crop({OUT}) | hflip"


def batches(**options):
    loader = stoker.Loader(
        Scenes(), batch_size=4, shuffle=True, seed=5, transform=SPEC, input_layout="chw", **options
    )
    out = [(np.array(b["image"]), np.array(b["mask"])) for b in loader]
    loader.close()
    return out


def sizes(indices: np.ndarray, start: int) -> list[int]:
    """The crop sizes whose nearest resample (``floor(j * size / OUT)``) could give
    ``indices``, widened by one each side for float rounding; torchvision confirms them."""
    j = np.arange(OUT)
    near = [n for n in range(1, S - start + 1)
            if np.array_equal(start + np.floor(j * n / OUT).astype(int), indices)]
    return sorted({m for n in near for m in (n - 1, n, n + 1) if 1 <= m <= S - start})


def draw_from_mask(mask: np.ndarray):
    """The candidate boxes ``(top, left, h, w, flip)`` whose nearest resample of the coordinate
    labels is ``mask`` exactly (nearest sampling can leave a box's size ambiguous by a pixel)."""
    flip = mask[0, 0] % S > mask[0, -1] % S
    unflipped = mask[:, ::-1] if flip else mask
    top, left = unflipped[0, 0] // S, unflipped[0, 0] % S
    coords = tv_tensors.Mask(torch.from_numpy(COORDS)[None])
    want = torch.from_numpy(np.ascontiguousarray(unflipped))
    found = []
    for h in sizes(unflipped[:, 0] // S, int(top)):
        for w in sizes(unflipped[0] % S, int(left)):
            m = F.resized_crop(coords, int(top), int(left), h, w, [OUT, OUT],
                               interpolation=InterpolationMode.NEAREST)
            if torch.equal(m[0], want):
                found.append((int(top), int(left), h, w, bool(flip)))
    return found


def test_image_and_mask_match_torchvision_on_the_same_draw():
    matched = 0
    for images, masks in batches():
        assert images.shape == (4, C, OUT, OUT) and images.dtype == np.float32
        assert masks.shape == (4, OUT, OUT) and masks.dtype == np.int64
        for image, mask in zip(images, masks):
            candidates = draw_from_mask(mask)
            assert candidates, "the mask is torchvision's nearest resized_crop of some box"
            # Which sample this is: the image's values identify it.
            errors = []
            for i in range(N):
                src = torch.from_numpy(bands(i))
                for top, left, h, w, flip in candidates:
                    ref = F.resized_crop(src, top, left, h, w, [OUT, OUT],
                                         interpolation=InterpolationMode.BILINEAR, antialias=True)
                    if flip:
                        ref = F.horizontal_flip(ref)
                    errors.append(float(np.abs(ref.numpy() - image).max()))
            assert min(errors) < 2e-5, min(errors)
            matched += 1
    assert matched == N


def test_the_mask_keeps_its_labels_and_batches_do_not_depend_on_workers():
    zero = batches(num_workers=0)
    three = batches(num_workers=3)
    assert len(zero) == len(three) == N // 4
    for (i0, m0), (i3, m3) in zip(zero, three):
        np.testing.assert_array_equal(i0, i3)
        np.testing.assert_array_equal(m0, m3)
        assert np.isin(m0, COORDS).all()


class ScenesU16Mask(Scenes):
    def __getitem__(self, i):
        return {"image": bands(i), "mask": COORDS.astype(np.uint16)}


def test_a_uint16_mask_keeps_its_type_and_a_float_image_takes_a_float_fill():
    """A 16-bit label map batches as uint16 with the labels the int64 one gets, and the padding
    of a float image is the fill in its own units."""
    spec = SPEC + f" | random_crop({OUT + 8}, padding=4, fill=-0.25)"

    def run(dataset):
        loader = stoker.Loader(dataset, batch_size=4, shuffle=True, seed=5, transform=spec,
                               input_layout="chw")
        out = [(np.array(b["image"]), np.array(b["mask"]), b.torch()["mask"].dtype)
               for b in loader]
        loader.close()
        return out

    for (image16, mask16, dtype16), (image64, mask64, dtype64) in zip(
            run(ScenesU16Mask()), run(Scenes())):
        assert mask16.dtype == np.uint16 and dtype16 == torch.uint16 and dtype64 == torch.int64
        np.testing.assert_array_equal(mask16.astype(np.int64), mask64)
        np.testing.assert_array_equal(image16, image64)
        assert (image16[:, :, :4, :] == np.float32(-0.25)).all()
        assert (mask16[:, :4, :] == 255).all(), "uncovered labels are ignore_index"
    with pytest.raises(stoker.InvalidArgumentError, match="fill 0.5 is not a uint16 value"):
        stoker.Loader(Scenes16(), batch_size=4, input_layout="chw",
                      transform=f"random_crop({OUT}, padding=2, fill=0.5)")


def test_a_colour_op_on_a_13_channel_image_is_refused_at_creation():
    with pytest.raises(stoker.InvalidArgumentError, match="13-channel float32"):
        stoker.Loader(Scenes(), batch_size=4, transform="color_jitter(brightness=0.2)",
                      input_layout="chw")


def bands16(i: int) -> np.ndarray:
    """``bands(i)`` as 16-bit data: uint16 over most of its range (values up to ~60000)."""
    return np.round(bands(i).clip(0, 1) * 60000).astype(np.uint16)


class Scenes16(Scenes):
    def __getitem__(self, i):
        return {"image": bands16(i), "mask": COORDS}


def test_a_uint16_image_matches_torchvision_on_a_float_copy_and_stays_uint16():
    loader = stoker.Loader(Scenes16(), batch_size=4, shuffle=True, seed=5, transform=SPEC,
                           input_layout="chw", num_workers=2)
    matched = 0
    for batch in loader:
        images, masks = np.array(batch["image"]), np.array(batch["mask"])
        assert batch.dtype("image") == "uint16"
        assert images.shape == (4, C, OUT, OUT) and images.dtype == np.uint16
        tensor = batch.torch()["image"]
        assert tensor.dtype == torch.uint16
        np.testing.assert_array_equal(tensor.numpy(), images)
        assert (images > 255).mean() > 0.5, "16-bit values survive"
        for image, mask in zip(images, masks):
            candidates = draw_from_mask(mask)
            assert candidates
            errors = []
            for i in range(N):
                # torchvision on a float copy of the same values, rounded once.
                src = torch.from_numpy(bands16(i).astype(np.float32))
                for top, left, h, w, flip in candidates:
                    ref = F.resized_crop(src, top, left, h, w, [OUT, OUT],
                                         interpolation=InterpolationMode.BILINEAR, antialias=True)
                    if flip:
                        ref = F.horizontal_flip(ref)
                    ref = ref.round().clamp(0, 65535).numpy()
                    diff = np.abs(ref - image.astype(np.float32))
                    errors.append((float(diff.max()), float((diff > 0).mean())))
            # float32 rounding of the two filters may put a value on the other side of a
            # half: at most one level apart, never more.
            worst, off = min(errors)
            assert worst <= 1.0 and off < 0.01, (worst, off)
            matched += 1
    loader.close()
    assert matched == N


def test_a_uint16_image_normalizes_in_stored_units_and_refuses_uint8():
    spec = f"{SPEC} | normalize(mean=30000, std=10000)"
    loader = stoker.Loader(Scenes16(), batch_size=4, transform=spec, input_layout="chw")
    batch = next(iter(loader))
    image = np.array(batch["image"])
    assert image.dtype == np.float32 and batch.torch()["image"].dtype == torch.float32
    # Stored units: 0..60000 lands within (0 - 3, 6 - 3), not scaled to [0, 1] first.
    assert image.min() >= -3.0 - 1e-4 and image.max() <= 3.0 + 1e-4 and image.max() > 1.0
    loader.close()
    with pytest.raises(stoker.InvalidArgumentError, match="not narrowed"):
        stoker.Loader(Scenes16(), batch_size=4, transform=SPEC, input_layout="chw", dtype="uint8")


def scene_boxes(i: int):
    """A different number of boxes per sample (some small enough for a crop to drop), in
    ``fmt``'s convention when converted, and one int64 label per box."""
    rng = np.random.default_rng(100 + i)
    k = 2 + i % 5
    x0 = rng.uniform(0, 56, k)
    y0 = rng.uniform(0, 56, k)
    w = rng.uniform(0.5, 30, k)
    h = rng.uniform(0.5, 30, k)
    xyxy = np.stack([x0, y0, np.minimum(x0 + w, S), np.minimum(y0 + h, S)], 1).astype(np.float32)
    return xyxy, (np.arange(k) + 10 * i).astype(np.int64)


def as_format(xyxy: np.ndarray, fmt: str) -> np.ndarray:
    b = torch.from_numpy(xyxy)
    return F.convert_bounding_box_format(b, old_format="XYXY", new_format=fmt.upper()).numpy()


class Detection:
    def __init__(self, fmt):
        self.fmt = fmt

    def __len__(self):
        return N

    def __getitem__(self, i):
        xyxy, labels = scene_boxes(i)
        return {"image": bands(i), "mask": COORDS, "boxes": as_format(xyxy, self.fmt), "labels": labels}


class DetectionCrowd(Detection):
    """With a per-box ``iscrowd`` row (the label's parity, as float32 pairs to give the rows a
    shape) beside the labels."""

    def __getitem__(self, i):
        sample = super().__getitem__(i)
        parity = (sample["labels"] % 2).astype(np.float32)
        sample["iscrowd"] = np.stack([parity, -parity], 1)
        return sample


SANITIZE = {"": {}, "strict": {"min_size": 3, "min_area": 20}}


@pytest.mark.parametrize("fmt, sanitize", [("xyxy", ""), ("xywh", ""), ("cxcywh", ""),
                                           ("xyxy", "strict")])
def test_boxes_match_torchvision_bounding_boxes_on_the_same_draw(fmt, sanitize):
    """The boxes against torchvision's on the sample's draw, then ``SanitizeBoundingBoxes``:
    by default (min_size=1, min_area=1), or with other thresholds and a per-box field that its
    ``labels_getter`` drops with the labels."""
    thresholds = SANITIZE[sanitize]
    extra = "".join(f", {k}={v}" for k, v in thresholds.items())
    if sanitize:
        extra += ", per_box=iscrowd"
    spec = (f"fields(image=image, mask=mask, boxes=boxes:{fmt}, labels=labels{extra})"
            f" | random_resized_crop({OUT}) | hflip")
    dataset = DetectionCrowd(fmt) if sanitize else Detection(fmt)
    loader = stoker.Loader(dataset, batch_size=4, shuffle=True, seed=9, transform=spec,
                           input_layout="chw", pad=-1)
    checked = dropped = 0
    for b in loader:
        images, masks = np.array(b["image"]), np.array(b["mask"])
        boxes, labels = np.array(b["boxes"]), np.array(b["labels"])
        crowds = np.array(b["iscrowd"]) if sanitize else [None] * len(boxes)
        lengths = np.array(b["boxes_lengths"])
        np.testing.assert_array_equal(lengths, np.array(b["labels_lengths"]))
        for image, mask, got, got_labels, crowd_rows, n in zip(images, masks, boxes, labels,
                                                               crowds, lengths):
            # The sample and the box of its draw: the image and the mask agree with
            # torchvision for exactly one (sample, box) among the candidates.
            best = None
            for i in range(N):
                src = torch.from_numpy(bands(i))
                for top, left, h, w, flip in draw_from_mask(mask):
                    ref = F.resized_crop(src, top, left, h, w, [OUT, OUT], antialias=True)
                    if flip:
                        ref = F.horizontal_flip(ref)
                    err = float(np.abs(ref.numpy() - image).max())
                    if best is None or err < best[0]:
                        best = (err, i, (top, left, h, w, flip))
            err, i, (top, left, h, w, flip) = best
            assert err < 2e-5
            xyxy, src_labels = scene_boxes(i)
            bb = tv_tensors.BoundingBoxes(torch.from_numpy(as_format(xyxy, fmt)),
                                          format=fmt.upper(), canvas_size=(S, S))
            bb = F.resized_crop(bb, top, left, h, w, [OUT, OUT])
            if flip:
                bb = F.horizontal_flip(bb)
            bb = F.clamp_bounding_boxes(bb)
            parity = torch.from_numpy((src_labels % 2).astype(np.float32))
            crowd = torch.stack([parity, -parity], 1)
            sanitized = tv2.SanitizeBoundingBoxes(
                **thresholds, labels_getter=lambda d: (d["labels"], d["iscrowd"]))(
                {"boxes": bb, "labels": torch.from_numpy(src_labels), "iscrowd": crowd})
            want, want_labels = sanitized["boxes"], sanitized["labels"]
            assert n == len(want), (got[:n], want)
            np.testing.assert_allclose(got[:n], want.numpy(), atol=1e-4)
            np.testing.assert_array_equal(got_labels[:n], want_labels.numpy())
            if sanitize:
                np.testing.assert_array_equal(crowd_rows[:n], sanitized["iscrowd"].numpy())
                assert (crowd_rows[n:] == -1).all()
            assert (got[n:] == -1).all() and (got_labels[n:] == -1).all()
            checked += n
            dropped += len(src_labels) - n
    loader.close()
    assert checked > 0 and dropped > 0


def test_an_rgb_uint8_image_from_a_dataset_keeps_its_mask_in_step():
    """A uint8 RGB image named by fields(image=...) stays a tensor of one size (it is not taken
    as a varying-size image), and its mask follows torchvision's nearest resample of the box."""

    class Rgb:
        def __len__(self):
            return 8

        def __getitem__(self, i):
            y, x = np.mgrid[0:S, 0:S]
            return {"image": np.stack([x, y, x * 0 + i], -1).astype(np.uint8), "mask": COORDS}

    loader = stoker.Loader(Rgb(), batch_size=4, seed=3, input_layout="hwc",
                           transform=f"fields(image=image, mask=mask) | random_resized_crop({OUT}) | hflip")
    for b in loader:
        image, mask = np.array(b["image"]), np.array(b["mask"])
        assert image.shape == (4, 3, OUT, OUT) and image.dtype == np.uint8
        for img, m in zip(image, mask):
            assert draw_from_mask(m), "the mask is a nearest resized_crop of the coordinates"
            # Red holds x: the image's pixel and the mask's label agree within the scale.
            assert np.abs(img[0].astype(int) - m % S).max() <= 2
    loader.close()


ROLES = "fields(image=image, mask=mask, boxes=boxes:xyxy, labels=labels)"
JITTER = f"{ROLES} | scale_jitter(40, 48, scale=0.8:1.4) | center_crop({OUT}) | hflip"
# RandomShortestSize(min_size=[40, 48, 56], max_size=50) on the 64x64 scenes: sides 40, 48 and
# (56 capped) 50.
SHORTEST = f"{ROLES} | random_shortest_size(40, 48, 56, max_size=50) | center_crop({OUT}) | hflip"


def jitter_batches(spec=JITTER, **options):
    loader = stoker.Loader(Detection("xyxy"), batch_size=4, shuffle=True, seed=4, transform=spec,
                           input_layout="chw", pad=-1, **options)
    out = [{k: np.array(v) for k, v in b.items()} for b in loader]
    loader.close()
    return out


@pytest.mark.parametrize("spec, candidates, least", [
    (JITTER, range(int(S * 40 / 64 * 0.8), int(S * 40 / 64 * 1.4) + 1), 4),
    (SHORTEST, (40, 48, 50), 3),
], ids=["scale_jitter", "random_shortest_size"])
def test_a_drawn_size_moves_image_mask_and_boxes_as_torchvision_on_the_same_draw(
        spec, candidates, least):
    """ScaleJitter(target_size=(48, 40), scale_range=(0.8, 1.4)) -- torchvision reads its
    target_size as (W, H): r = min(target[1] / h, target[0] / w) -- so scale_jitter(40, 48):
    r = min(40/64, 48/64) * u, each side int(64 * r); and RandomShortestSize. The drawn side is
    read back from the coordinate mask (torchvision's nearest resize of it, centre-cropped and
    maybe flipped, must equal the delivered mask); the image and the boxes must then equal
    torchvision's."""
    coords = tv_tensors.Mask(torch.from_numpy(COORDS)[None])
    sides = set()
    checked = 0
    for b in jitter_batches(spec):
        assert b["image"].shape == (4, C, OUT, OUT) and b["mask"].shape == (4, OUT, OUT)
        for image, mask, got, got_labels, n in zip(b["image"], b["mask"], b["boxes"], b["labels"],
                                                   b["boxes_lengths"]):
            draws = []
            for side in candidates:
                m = F.center_crop(F.resize(coords, [side, side],
                                           interpolation=InterpolationMode.NEAREST), [OUT, OUT])
                for flip in (False, True):
                    mm = F.horizontal_flip(m) if flip else m
                    if torch.equal(mm[0], torch.from_numpy(mask)):
                        draws.append((side, flip))
            assert draws, "the mask is torchvision's nearest resize of the coordinates"
            best = None
            for i in range(N):
                for side, flip in draws:
                    ref = F.center_crop(F.resize(torch.from_numpy(bands(i)), [side, side],
                                                 antialias=True), [OUT, OUT])
                    if flip:
                        ref = F.horizontal_flip(ref)
                    err = float(np.abs(ref.numpy() - image).max())
                    if best is None or err < best[0]:
                        best = (err, i, side, flip)
            err, i, side, flip = best
            assert err < 2e-5, err
            sides.add(side)
            xyxy, src_labels = scene_boxes(i)
            bb = tv_tensors.BoundingBoxes(torch.from_numpy(xyxy), format="XYXY", canvas_size=(S, S))
            bb = F.center_crop(F.resize(bb, [side, side]), [OUT, OUT])
            if flip:
                bb = F.horizontal_flip(bb)
            bb = F.clamp_bounding_boxes(bb)
            want, want_labels = tv2.SanitizeBoundingBoxes(min_size=1)(
                {"boxes": bb, "labels": torch.from_numpy(src_labels)}
            ).values()
            assert n == len(want), (got[:n], want)
            np.testing.assert_allclose(got[:n], want.numpy(), atol=1e-4)
            np.testing.assert_array_equal(got_labels[:n], want_labels.numpy())
            checked += 1
    assert checked == N
    assert len(sides) >= least, sides


def test_scale_jitter_draws_do_not_depend_on_workers_and_an_unfixed_size_is_refused():
    zero, three = jitter_batches(num_workers=0), jitter_batches(num_workers=3)
    for a, b in zip(zero, three):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    with pytest.raises(stoker.StokerError, match="scale_jitter draws each sample's size"):
        stoker.Loader(Detection("xyxy"), batch_size=4, input_layout="chw", pad=-1,
                      transform="fields(image=image, mask=mask) | scale_jitter(40) | hflip")


ZOOM = (f"fields(image=image, mask=mask, boxes=boxes:xyxy, labels=labels, ignore_index=-1)"
        f" | random_zoom_out(fill=2, side_range=1:2, p=0.7) | center_crop({S})")


def test_random_zoom_out_moves_image_mask_and_boxes_as_torchvision_on_the_same_draw():
    """RandomZoomOut(fill={Image: 2, Mask: -1}, side_range=(1, 2), p=0.7), then CenterCrop(S):
    the canvas side and the image's offset are read back from the coordinate mask (the first
    label in view says where the image lies), and every candidate is checked by torchvision's
    pad + center_crop of the mask; the image must then equal torchvision's exactly (padding and
    cropping copy values) and the boxes its padded, cropped, clamped and sanitized boxes."""
    coords = tv_tensors.Mask(torch.from_numpy(COORDS)[None])
    sources = [torch.from_numpy(bands(i)) for i in range(N)]
    loader = stoker.Loader(Detection("xyxy"), batch_size=4, shuffle=True, seed=6, transform=ZOOM,
                           input_layout="chw", pad=-1)
    canvases = []
    for b in loader:
        for image, mask, got, got_labels, n in zip(
            np.array(b["image"]), np.array(b["mask"]), np.array(b["boxes"]),
            np.array(b["labels"]), np.array(b["boxes_lengths"])
        ):
            oy, ox = np.argwhere(mask >= 0)[0]
            sy, sx = divmod(int(mask[oy, ox]), S)
            draws = []
            for side in range(S, 2 * S + 1):
                crop = int(round((side - S) / 2.0))
                left, top = int(ox) - sx + crop, int(oy) - sy + crop
                if not (0 <= left <= side - S and 0 <= top <= side - S):
                    continue
                padding = [left, top, side - S - left, side - S - top]
                m = F.center_crop(F.pad(coords, padding, fill=-1), [S, S])
                if torch.equal(m[0], torch.from_numpy(mask)):
                    draws.append(padding)
            assert draws, "the mask is torchvision's padded, centre-cropped coordinates"
            # Draws that agree on the mask put the same pixels in view (a canvas a little wider
            # with the image a little further right shows the same window): one stands for all.
            padding = draws[0]
            err, i = min((float(np.abs(F.center_crop(F.pad(src, padding, fill=2.0), [S, S]).numpy()
                                       - image).max()), i) for i, src in enumerate(sources))
            assert err == 0.0, err
            canvases.append(S + padding[0] + padding[2])
            xyxy, src_labels = scene_boxes(i)
            bb = tv_tensors.BoundingBoxes(torch.from_numpy(xyxy), format="XYXY", canvas_size=(S, S))
            bb = F.clamp_bounding_boxes(F.center_crop(F.pad(bb, padding), [S, S]))
            want, want_labels = tv2.SanitizeBoundingBoxes(min_size=1)(
                {"boxes": bb, "labels": torch.from_numpy(src_labels)}
            ).values()
            assert n == len(want), (got[:n], want)
            np.testing.assert_allclose(got[:n], want.numpy(), atol=1e-4)
            np.testing.assert_array_equal(got_labels[:n], want_labels.numpy())
    loader.close()
    assert len(canvases) == N
    # Some samples zoomed out (a canvas wider than the image), and within side_range.
    assert max(canvases) > S and all(S <= c <= 2 * S for c in canvases), canvases


def scene_points(i: int) -> np.ndarray:
    """A different number of keypoints per sample, ``(x, y, visibility)``: pixel positions
    anywhere in the image (so that crops and warps push some out), visibility 1 or 2, and one
    point already invisible."""
    rng = np.random.default_rng(200 + i)
    k = 3 + i % 4
    xy = rng.uniform(0, S - 1, (k, 2))
    vis = rng.integers(1, 3, (k, 1)).astype(np.float64)
    vis[0] = 0
    return np.concatenate([xy, vis], 1).astype(np.float32)


class Posed:
    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"image": bands(i), "mask": COORDS, "points": scene_points(i)}


POSE_OPS = ("random_resized_crop(40, scale=0.5:1) | hflip | random_zoom_out(side_range=1:1.5, p=0.7)"
            " | center_crop(40) | affine(degrees=20, translate=0.1:0.1, scale=0.9:1.1, shear=5)"
            " | vflip")
POSE = f"fields(image=image, mask=mask, keypoints=points) | {POSE_OPS}"


def pose_batches(**options):
    loader = stoker.Loader(Posed(), batch_size=4, seed=13, transform=POSE, input_layout="chw",
                           **options)
    out = [{k: np.array(v) for k, v in b.items()} for b in loader]
    loader.close()
    return out


def torchvision_points(i: int):
    """Sample ``i``'s keypoints through torchvision's functional ops with the parameters stoker
    drew for it (``transform_image`` replays draw ``i`` of the same seed; unshuffled, draw ``i``
    is sample ``i``), and the visibility stoker documents: 0 once a point is outside the canvas
    after an op (``SanitizeKeyPoints``'s test), else as given."""
    _, params = stoker.transform_image(POSE_OPS, np.zeros((S, S, 3), np.uint8), (40, 40), seed=13,
                                       index=i)
    by = {p["op"]: p for p in params}
    src = scene_points(i)
    kp = tv_tensors.KeyPoints(torch.from_numpy(src[:, :2].copy()), canvas_size=(S, S))
    inside = np.ones(len(src), bool)

    def step(k):
        h, w = k.canvas_size
        x, y = k[:, 0].numpy(), k[:, 1].numpy()
        inside[:] &= (x >= 0) & (x < w) & (y >= 0) & (y < h)
        return k

    plan = by["plan"]
    top, left, h, w = (int(plan[k]) for k in ("top", "left", "height", "width"))
    kp = step(F.resized_crop(kp, top, left, h, w, [40, 40]))
    if plan["flip"]:
        kp = step(F.horizontal_flip(kp))
    zoom = by["random_zoom_out"]
    if zoom["apply"]:
        padding = [zoom["left"], zoom["top"], zoom["width"] - 40 - zoom["left"],
                   zoom["height"] - 40 - zoom["top"]]
        kp = step(F.pad(kp, padding))
    kp = step(F.center_crop(kp, [40, 40]))
    a = by["affine"]
    kp = step(F.affine(kp, angle=a["angle"], translate=[int(t) for t in a["translate"]],
                       scale=a["scale"], shear=a["shear"]))
    if by["vflip"]["apply"]:
        kp = step(F.vertical_flip(kp))
    vis = np.where(inside, src[:, 2], 0)
    return np.concatenate([kp.numpy(), vis[:, None]], 1), zoom["apply"]


def test_keypoints_match_torchvision_keypoints_on_the_same_draw():
    """Crop, resize, flips, a zoom-out's padding and an affine warp: the delivered keypoints
    equal torchvision's ``KeyPoints`` through the same ops with the same parameters (none is
    dropped or clamped), and the visibility of a point that left the canvas is 0."""
    batches = pose_batches(pad=-1)
    seen = left_canvas = zoomed = 0
    for b in batches:
        assert b["image"].shape == (4, C, 40, 40)
        for got, n in zip(b["points"], b["points_lengths"]):
            i = seen
            want, zoom = torchvision_points(i)
            assert n == len(want) == len(scene_points(i))
            np.testing.assert_allclose(got[:n], want, atol=2e-3)
            assert (got[n:] == -1).all()
            left_canvas += int(((want[:, 2] == 0) & (scene_points(i)[:, 2] > 0)).sum())
            zoomed += zoom
            seen += 1
    assert seen == N
    # The draws moved some points out of the canvas, and some zoomed out.
    assert left_canvas > 0 and zoomed > 0


def test_keypoints_do_not_depend_on_workers_or_the_ragged_layout():
    zero = pose_batches(pad=-1)
    three = pose_batches(pad=-1, num_workers=3)
    flat = pose_batches(ragged="offsets")
    for a, b, f in zip(zero, three, flat):
        np.testing.assert_array_equal(a["points"], b["points"])
        np.testing.assert_array_equal(a["image"], b["image"])
        rows = [p[:n] for p, n in zip(a["points"], a["points_lengths"])]
        np.testing.assert_array_equal(np.concatenate(rows), f["points"])
        np.testing.assert_array_equal(np.cumsum([0] + [len(r) for r in rows]), f["points_offsets"])


def test_keypoints_of_the_wrong_shape_are_refused_in_words():
    class Flat(Posed):
        def __getitem__(self, i):
            return {"image": bands(i), "mask": COORDS, "points": scene_points(i)[:, :1].copy()}

    with pytest.raises(stoker.InvalidArgumentError, match="keypoints are float32 rows of 2"):
        stoker.Loader(Flat(), batch_size=4, transform=POSE, input_layout="chw", pad=-1)


IOU = (f"fields(image=image, mask=mask, boxes=boxes:xyxy, labels=labels)"
       f" | random_iou_crop | resize({OUT}, {OUT}) | hflip")


def test_random_iou_crop_matches_torchvision_crop_of_the_same_rectangle():
    """RandomIoUCrop's rectangle read back from the coordinate mask (as ``resized_crop`` to
    ``OUT``); the image must equal torchvision's ``resized_crop`` of it and the boxes
    torchvision's ``crop`` + ``resize`` with the boxes whose centre lies outside zeroed (what
    ``RandomIoUCrop.transform`` does), clamped and sanitized, labels with them."""
    loader = stoker.Loader(Detection("xyxy"), batch_size=4, shuffle=True, seed=21, transform=IOU,
                           input_layout="chw", pad=-1)
    cropped = cut = 0
    for b in loader:
        for image, mask, got, got_labels, n in zip(
            np.array(b["image"]), np.array(b["mask"]), np.array(b["boxes"]),
            np.array(b["labels"]), np.array(b["boxes_lengths"])
        ):
            best = None
            for i in range(N):
                src = torch.from_numpy(bands(i))
                for top, left, h, w, flip in draw_from_mask(mask):
                    ref = F.resized_crop(src, top, left, h, w, [OUT, OUT], antialias=True)
                    if flip:
                        ref = F.horizontal_flip(ref)
                    err = float(np.abs(ref.numpy() - image).max())
                    if best is None or err < best[0]:
                        best = (err, i, (top, left, h, w, flip))
            err, i, (top, left, h, w, flip) = best
            assert err < 2e-5
            xyxy, src_labels = scene_boxes(i)
            cx, cy = (xyxy[:, 0] + xyxy[:, 2]) / 2, (xyxy[:, 1] + xyxy[:, 3]) / 2
            within = (left < cx) & (cx < left + w) & (top < cy) & (cy < top + h)
            bb = tv_tensors.BoundingBoxes(torch.from_numpy(xyxy), format="XYXY", canvas_size=(S, S))
            bb = F.crop(bb, top, left, h, w)
            bb[~torch.from_numpy(within)] = 0
            bb = F.resize(bb, [OUT, OUT])
            if flip:
                bb = F.horizontal_flip(bb)
            bb = F.clamp_bounding_boxes(bb)
            want, want_labels = tv2.SanitizeBoundingBoxes(min_size=1)(
                {"boxes": bb, "labels": torch.from_numpy(src_labels)}
            ).values()
            assert n == len(want), (got[:n], want)
            np.testing.assert_allclose(got[:n], want.numpy(), atol=1e-4)
            np.testing.assert_array_equal(got_labels[:n], want_labels.numpy())
            cropped += (h, w) != (S, S)
            cut += int((~within).sum())
    loader.close()
    # Most samples were cropped, and some boxes were dropped for their centre.
    assert cropped > N // 2 and cut > 0, (cropped, cut)


def test_random_iou_crop_needs_boxes_and_does_not_depend_on_workers():
    with pytest.raises(stoker.InvalidArgumentError, match="random_iou_crop draws its crop"):
        stoker.Loader(Scenes(), batch_size=4, input_layout="chw",
                      transform=f"fields(image=image, mask=mask) | random_iou_crop | resize({OUT}, {OUT})")

    def run(workers):
        loader = stoker.Loader(Detection("xyxy"), batch_size=4, seed=3, transform=IOU,
                               input_layout="chw", pad=-1, num_workers=workers)
        out = [(np.array(b["mask"]), np.array(b["boxes"])) for b in loader]
        loader.close()
        return out

    for (m0, b0), (m3, b3) in zip(run(0), run(3)):
        np.testing.assert_array_equal(m0, m3)
        np.testing.assert_array_equal(b0, b3)


def test_box_format_option_is_the_format_of_boxes_named_without_a_suffix():
    def run(boxes, **options):
        spec = (f"fields(image=image, mask=mask, boxes={boxes}, labels=labels)"
                f" | random_resized_crop({OUT}) | hflip")
        loader = stoker.Loader(Detection("xywh"), batch_size=4, seed=2, transform=spec,
                               input_layout="chw", pad=-1, **options)
        out = [(np.array(b["boxes"]), np.array(b["boxes_lengths"])) for b in loader]
        loader.close()
        return out

    by_suffix = run("boxes:xywh")
    for (a, la), (b, lb) in zip(run("boxes", box_format="xywh"), by_suffix):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)
    # The suffix wins over the option.
    for (a, _), (b, _) in zip(run("boxes:xywh", box_format="cxcywh"), by_suffix):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(stoker.InvalidArgumentError, match="not a box format"):
        run("boxes", box_format="ltrb")


def test_a_python_dataset_of_pictures_of_varying_size_moves_its_masks_with_them():
    """A segmentation dataset written for torch (VOC's, COCO's): PIL pictures of varying size
    with an [H, W] integer mask each. The picture's red and green channels are its x and y, the
    mask's label y * W + x, so each output pixel's mask says where it came from and the image
    there must hold about that place, under one draw of crop and flip."""
    Image = pytest.importorskip("PIL.Image")
    sizes = [(40, 52), (61, 35), (48, 48), (33, 70)]

    class Pictures:
        def __len__(self):
            return 8

        def __getitem__(self, i):
            h, w = sizes[i % 4]
            y, x = np.mgrid[:h, :w]
            rgb = np.stack([x, y, np.full_like(x, i)], axis=-1).astype(np.uint8)
            return {"image": Image.fromarray(rgb), "mask": (y * w + x).astype(np.int32)}

    loader = stoker.Loader(
        Pictures(), batch_size=4, shuffle=True, seed=2, num_workers=2,
        transform="fields(image=image, mask=mask) | random_resized_crop(24) | hflip",
    )
    flips = 0
    for batch in loader:
        images, masks = np.array(batch["image"]).astype(int), np.array(batch["mask"])
        assert images.shape == (4, 3, 24, 24) and masks.shape == (4, 24, 24)
        for image, mask in zip(images, masks):
            h, w = sizes[image[2, 0, 0] % 4]
            y, x = mask // w, mask % w
            assert (y < h).all()
            flips += x[0, 0] > x[0, -1]
            # Bilinear (image) and nearest (mask) samples of one crop lie within half an input
            # step of each other (under 3 pixels for these crops), plus a level of rounding.
            assert np.abs(image[0] - x).max() <= 3 and np.abs(image[1] - y).max() <= 3
    loader.close()
    assert 0 < flips < 8, "hflip drew both ways"
