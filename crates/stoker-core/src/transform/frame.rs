//! The crop-sized RGB8 image the ops after the geometry plan work on, with the worker's spare
//! buffers: one per worker, reused from sample to sample.

/// The image the stage ops work on and the worker's spare buffers, all reused.
#[derive(Default)]
pub(super) struct Frame {
    pub(super) img: Vec<u8>,
    pub(super) spare: Vec<u8>,
    pub(super) floats: Vec<f32>,
    pub(super) kernel: Vec<f32>,
    pub(super) width: usize,
    pub(super) height: usize,
}

impl Frame {
    /// Runs `kernel(src, dst)` into the spare buffer (resized to `width`x`height`), then makes
    /// it the image.
    pub(super) fn replace(
        &mut self,
        width: usize,
        height: usize,
        kernel: impl FnOnce(&[u8], &mut [u8]),
    ) {
        self.spare.clear();
        self.spare.resize(width * height * 3, 0);
        kernel(&self.img, &mut self.spare);
        std::mem::swap(&mut self.img, &mut self.spare);
        self.width = width;
        self.height = height;
    }
}
