"""freshroll.ports: what the pipeline's stages await and wait with (the seams, the waits in
flight, the executors that can walk away), implemented by the placements and the simulator."""
