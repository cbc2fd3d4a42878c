"""What a step costs in time: MFU, the demo's time, traditional against optimized, and each
memory saving's time cost beside what it saves."""
