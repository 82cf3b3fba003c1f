module vramguard.local/simcuda

go 1.22
