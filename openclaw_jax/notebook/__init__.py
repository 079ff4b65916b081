"""Helpers for the notebooks (and scripts) that look at a run directory: `tb_reader` reads its
TensorBoard event files without TensorBoard, `run_inspection` finds or creates a run and reads its
pieces back. Nothing in training or serving imports them."""
