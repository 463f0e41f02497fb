"""Faithfulness of saliency maps (cam --evaluate): deletion/insertion metrics, ROAD imputation and the model passes."""
