"""Stand-in for facebookresearch/sam3: ``sam3.model_builder.build_sam3_video_predictor`` and its request API."""

__version__ = "0.1.0"
