package kafka

// Applying is how many partitions c counts as applying (see counted): 0
// once no Run is applying records.
func Applying(c *Consumer) int32 { return c.applying.Load() }
