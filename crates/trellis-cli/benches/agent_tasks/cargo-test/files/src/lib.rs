/// The area of a rectangle.
pub fn area(width: u32, height: u32) -> u32 {
    width + height
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn area_multiplies() {
        assert_eq!(area(3, 4), 12);
    }
}
