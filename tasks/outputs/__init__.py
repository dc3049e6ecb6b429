"""What the stages write: atomic files with completion markers, where each output lives, the intermediates.

Also the geometry and y2r's per-window rules that the dataset files follow.
"""
