// The CPU emulation defines the f16 types in sim.h; cu/quant.cuh includes this in their stead.
#pragma once
