"""The dataset-export function: export requests from the export queue into the exports bucket."""
