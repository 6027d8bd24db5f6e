//! A real browser for the console's tests, over WebDriver (fantoccini): a headless Chromium
//! session, and the few steps the tests take on a page. Shared with the two-site bed's console
//! test (e2e/tests/console.rs includes this file).

use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};

/// How long a step waits for its element.
const WAIT: Duration = Duration::from_secs(20);

/// A new headless Chromium from the WebDriver at `driver` (`http://127.0.0.1:PORT`), `width`
/// by `height`, that accepts the test's certificate.
pub(crate) async fn session(driver: &str, width: u32, height: u32) -> Client {
    let caps = serde_json::json!({
        "acceptInsecureCerts": true,
        "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--no-first-run",
                format!("--window-size={width},{height}"),
            ],
        },
    });
    let serde_json::Value::Object(caps) = caps else {
        unreachable!()
    };
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(driver)
        .await
        .expect("a Chromium session")
}

/// The text of the element `css` names, once there is one; a failure shows the page.
pub(crate) async fn text(c: &Client, css: &str) -> String {
    let found = c.wait().at_most(WAIT).for_element(Locator::Css(css)).await;
    match found {
        Ok(e) => e.text().await.unwrap(),
        Err(e) => {
            let url = c.current_url().await.map(|u| u.to_string());
            let page = c.source().await.unwrap_or_default();
            panic!("{css}: {e}, at {url:?}:\n{page}");
        }
    }
}

/// Clicks the element `css` names, once there is one.
pub(crate) async fn click(c: &Client, css: &str) {
    c.wait()
        .at_most(WAIT)
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap();
}

/// Types `value` into the field `css` names, once there is one, in place of what it held.
pub(crate) async fn fill(c: &Client, css: &str, value: &str) {
    let e = c
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"));
    e.clear().await.unwrap();
    e.send_keys(value).await.unwrap();
}
