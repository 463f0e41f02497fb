"""Class activation maps: the CAM formulas, where a map is taken, its passes, video layouts and dense-task maps."""
